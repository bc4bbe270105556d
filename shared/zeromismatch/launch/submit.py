"""Launch a Python function as a job: in-process, as a local subprocess, or on Slurm, via submitit.

``submit(fn, *args, cluster=..., profile=...)`` resolves one configuration (profile defaults, then
the explicit per-job overrides), writes it as JSON next to the job's logs, and hands it to
``submitit.AutoExecutor``:

- ``cluster="debug"``: runs ``fn`` in this process when the result is requested (pdb-friendly);
- ``cluster="local"``: runs ``fn`` in a subprocess on this machine;
- ``cluster="slurm"``: ``sbatch`` through submitit's ``SlurmExecutor`` (one job, or one job array).

``dry_run=True`` submits nothing. For Slurm it writes the exact sbatch script submitit would submit:
the parameters go through the real ``AutoExecutor`` translation into a real ``SlurmExecutor``
(subclassed only so that it does not insist on ``srun`` being installed), and the text comes from
that executor's own ``_make_submission_file_text``. submitit (1.5.4) has no public call for the
script text, so this reaches into private names (``AutoExecutor._executor``,
``SlurmExecutor._make_submission_file_text`` and ``._submitit_command_str``); the slurm-marked test
guards it by comparing the dry-run script with the script of a real submission, byte for byte.

``ray=True`` (Slurm) puts the Ray head/worker recipe of :mod:`.ray_cluster` before the job's
command (and ``ray stop`` on every node at the script's exit), and runs ``fn`` once, as one srun
step on the head node: the Ray driver, and the step submitit's ``SIGUSR2`` handler runs in (a
checkpointable ``fn`` is checkpointed and the job requeued at preemption or the time limit).
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeromismatch.io import atomic_write_json, atomic_write_text
from zeromismatch.launch.profiles import ClusterProfile, load_profile
from zeromismatch.launch.ray_cluster import (
    ray_driver_srun_args,
    ray_slurm_setup_lines,
    ray_slurm_teardown_lines,
)

CLUSTERS = ("local", "debug", "slurm")
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class DryRun:
    """What a dry run wrote: the sbatch script (Slurm only) and the resolved configuration."""

    folder: Path
    scripts: list[Path]
    config_path: Path
    config: dict[str, Any]


def _positive_int(name: str, value: object, minimum: int = 1) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def resolve_job(
    profile: ClusterProfile,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    timeout_min: int | None = None,
    cpus_per_task: int | None = None,
    tasks_per_node: int | None = None,
    mem_gb: float | None = None,
) -> dict[str, Any]:
    """The job's resources: each explicit (non-None) override wins over the profile's value."""
    _positive_int("nodes", nodes)
    _positive_int("gpus_per_node", gpus_per_node, minimum=0)
    _positive_int("timeout_min", timeout_min)
    _positive_int("cpus_per_task", cpus_per_task)
    _positive_int("tasks_per_node", tasks_per_node)
    is_number = isinstance(mem_gb, int | float) and not isinstance(mem_gb, bool)
    if mem_gb is not None and not (is_number and math.isfinite(mem_gb) and mem_gb > 0):
        raise ValueError(f"mem_gb must be a number > 0 and finite, got {mem_gb!r}")
    overrides = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "timeout_min": timeout_min,
        "cpus_per_task": cpus_per_task,
        "tasks_per_node": tasks_per_node,
        "mem_gb": mem_gb,
    }
    return {key: getattr(profile, key) if value is None else value for key, value in overrides.items()}


def executor_parameters(
    profile: ClusterProfile,
    resources: dict[str, Any],
    job_name: str,
    setup: Sequence[str],
    teardown: Sequence[str] = (),
    srun_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Keyword arguments for ``AutoExecutor.update_parameters`` (generic names + ``slurm_*``)."""
    params: dict[str, Any] = {"name": job_name, **resources}
    if params["gpus_per_node"] == 0:
        # No --gpus-per-node=0 line: clusters without GPU GRES configured may reject any GPU request.
        del params["gpus_per_node"]
    params["slurm_partition"] = profile.partition
    if profile.account is not None:
        params["slurm_account"] = profile.account
    if profile.exclusive:
        params["slurm_exclusive"] = True
    if setup:
        params["slurm_setup"] = list(setup)
    if teardown:
        params["slurm_teardown"] = list(teardown)
    if profile.sbatch_extra:
        params["slurm_additional_parameters"] = dict(profile.sbatch_extra)
    if srun_args:
        params["slurm_srun_args"] = list(srun_args)
    return params


def _dry_run_executor(folder: Path, params: dict[str, Any]):
    """A real AutoExecutor whose inner executor is a SlurmExecutor that does not need srun."""
    import submitit
    from submitit.slurm.slurm import SlurmExecutor

    class _SlurmExecutorWithoutSrun(SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 2

    auto = submitit.AutoExecutor(folder=folder, cluster="debug")
    # AutoExecutor translates generic names and picks slurm_* keys by these two attributes only.
    auto._executor = _SlurmExecutorWithoutSrun(auto.folder)
    auto.cluster = "slurm"
    auto.update_parameters(**params)
    return auto._executor


def sbatch_script(folder: str | Path, params: dict[str, Any], array_size: int | None = None) -> str:
    """The sbatch text submitit writes for ``params`` (AutoExecutor keywords); arrays as submitit does."""
    executor = _dry_run_executor(Path(folder), params)
    if array_size is not None:
        executor.parameters["map_count"] = array_size
    return executor._make_submission_file_text(executor._submitit_command_str, uuid.uuid4().hex)


def _describe_call(fn: Callable[..., Any], args: tuple, array: list[tuple] | None) -> dict[str, Any]:
    def short(value: object) -> str:
        text = repr(value)
        return text if len(text) <= 200 else text[:197] + "..."

    return {
        "function": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}",
        "args": [short(arg) for arg in args],
        "array": None if array is None else [[short(arg) for arg in element] for element in array],
    }


def submit(
    fn: Callable[..., Any],
    *args: Any,
    cluster: str = "local",
    profile: str | ClusterProfile = "local-cpu",
    folder: str | Path | None = None,
    job_name: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    timeout_min: int | None = None,
    cpus_per_task: int | None = None,
    tasks_per_node: int | None = None,
    mem_gb: float | None = None,
    array: Iterable[tuple] | None = None,
    ray: bool = False,
    dry_run: bool = False,
):
    """Submit ``fn(*args)`` and return its submitit ``Job`` (a list of jobs when ``array`` is given;
    with ``ray=True`` on several Slurm nodes, the job's task 0, the one that runs ``fn``).

    ``array``: one job per element, run as a single Slurm job array; each element is a tuple of
    extra positional arguments appended after ``args`` (``fn(*args, *element)``). For keyword
    arguments, pass a ``functools.partial``. ``folder`` holds pickles, logs and
    ``<job_name>.config.json`` (default ``runs/submitit/<job_name>`` under the working directory;
    on Slurm it must be on a file system every node sees). With ``dry_run=True`` nothing is
    submitted and a :class:`DryRun` is returned; the sbatch script is written for
    ``cluster="slurm"`` only (the others have none).
    """
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {CLUSTERS}, got {cluster!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    chosen = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
    job_name = job_name or getattr(fn, "__name__", "job")
    if not _JOB_NAME.match(job_name):
        raise ValueError(f"job_name must be letters, digits, '_', '.', '-' only, got {job_name!r}")
    elements: list[tuple] | None = None
    if array is not None:
        elements = list(array)
        if not elements:
            raise ValueError("array must have at least one element")
        for element in elements:
            if not isinstance(element, tuple):
                raise TypeError(f"each array element must be a tuple of extra arguments, got {element!r}")
    resources = resolve_job(
        chosen,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        timeout_min=timeout_min,
        cpus_per_task=cpus_per_task,
        tasks_per_node=tasks_per_node,
        mem_gb=mem_gb,
    )
    if cluster != "slurm" and resources["nodes"] != 1:
        raise ValueError(f"nodes={resources['nodes']} needs cluster='slurm'; {cluster!r} runs on one node")
    if ray and resources["tasks_per_node"] != 1:
        raise ValueError(
            f"ray=True needs tasks_per_node=1 (one Ray node per Slurm node), "
            f"got {resources['tasks_per_node']}"
        )

    resolved_profile, unresolved = chosen.resolved()
    if cluster == "slurm" and unresolved and not dry_run:
        missing = ", ".join(f"field {field!r} needs ${var}" for field, var in unresolved.items())
        raise ValueError(f"cluster profile {chosen.name!r} has unresolved placeholders: {missing}")
    if folder is None:
        folder = Path("runs") / "submitit" / job_name
    folder = Path(folder).expanduser().absolute()
    setup, teardown, srun_args = list(resolved_profile.setup), [], []
    if cluster == "slurm" and ray:
        setup += ray_slurm_setup_lines(folder, gpus_per_node=resources["gpus_per_node"])
        teardown = ray_slurm_teardown_lines()
        srun_args = ray_driver_srun_args(resources["cpus_per_task"])
    params = executor_parameters(resolved_profile, resources, job_name, setup, teardown, srun_args)

    import submitit
    from submitit.core.utils import JobPaths

    from zeromismatch._provenance import git_commit

    config: dict[str, Any] = {
        "cluster": cluster,
        "job_name": job_name,
        "folder": str(folder),
        "profile": chosen.to_dict(),
        "unresolved_placeholders": unresolved,
        "resources": resources,
        "executor_parameters": params,
        "ray": ray,
        "call": _describe_call(fn, args, elements),
        "python": sys.executable,
        "git_commit": git_commit(),
        "dry_run": dry_run,
    }
    # submitit allows "%j" in the folder (one folder per job); the config goes above the first %j.
    config_path = JobPaths.get_first_id_independent_folder(folder) / f"{job_name}.config.json"
    if dry_run:
        scripts = []
        if cluster == "slurm":
            script = config_path.parent / f"{job_name}.sbatch"
            array_size = None if elements is None else len(elements)
            atomic_write_text(script, sbatch_script(folder, params, array_size))
            scripts.append(script)
        atomic_write_json(config_path, config)
        return DryRun(folder=folder, scripts=scripts, config_path=config_path, config=config)

    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise RuntimeError(
            "cluster='slurm' needs Slurm's sbatch and srun on PATH; dry_run=True only writes the scripts"
        )
    atomic_write_json(config_path, config)
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(**params)

    def driver(job):
        # with Ray on several nodes fn runs once, as task 0 on the head (the other nodes hold Ray
        # workers and run no function), so the job's result is that task's: submitit would wait for
        # one from every node's task (found by the two-node test: "task 1 has not produced any output")
        return job.task(0) if cluster == "slurm" and ray and job.num_tasks > 1 else job

    if elements is None:
        return driver(executor.submit(fn, *args))
    with executor.batch():
        jobs = [executor.submit(fn, *args, *element) for element in elements]
    return [driver(job) for job in jobs]
