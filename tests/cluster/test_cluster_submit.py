"""submit(): dry-run sbatch scripts and configs, real local/debug runs, and one clear error per bad input.

Functions handed to submitit are stdlib callables (``operator.pow``, ``os.getpid``) so that the job's
subprocess can unpickle them by reference without importing this test module.
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
from pathlib import Path

import pytest

from zeromismatch.launch import load_profile, ray_slurm_setup_lines, submit
from zeromismatch.launch.submit import DryRun


def _sbatch_flags(script: str) -> dict[str, str]:
    flags = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            flags[key] = value
    return flags


@pytest.mark.cluster("submitit")
def test_dry_run_writes_sbatch_and_config_without_submitting(tmp_path, monkeypatch):
    monkeypatch.setenv("ZM_SLURM_PARTITION", "gpu-h200")
    monkeypatch.setenv("ZM_SLURM_ACCOUNT", "proj-42")
    result = submit(
        operator.pow, 2, 10,
        cluster="slurm", profile="h200-node", folder=tmp_path, job_name="full-run",
        nodes=4, timeout_min=720, dry_run=True,
    )  # fmt: skip
    assert isinstance(result, DryRun)
    assert result.scripts == [tmp_path / "full-run.sbatch"]
    script = result.scripts[0].read_text()
    flags = _sbatch_flags(script)
    assert flags["partition"] == "gpu-h200"
    assert flags["account"] == "proj-42"
    assert flags["gpus-per-node"] == "8"
    assert flags["nodes"] == "4"
    assert flags["time"] == "720"
    assert flags["ntasks-per-node"] == "1"
    assert flags["cpus-per-task"] == "96"
    assert flags["mem"] == "960GB"
    assert flags["job-name"] == "full-run"
    assert "exclusive" in flags
    assert "srun --unbuffered" in script and "-m submitit.core._submit" in script
    subprocess.run(["bash", "-n", str(result.scripts[0])], check=True)

    config = json.loads(result.config_path.read_text())
    assert config["dry_run"] is True and config["cluster"] == "slurm"
    assert config["resources"] == {
        "nodes": 4, "gpus_per_node": 8, "timeout_min": 720, "cpus_per_task": 96, "tasks_per_node": 1,
        "mem_gb": 960.0,
    }  # fmt: skip
    assert config["profile"]["name"] == "h200-node"
    assert config["unresolved_placeholders"] == {}
    assert config["call"]["function"] == "_operator.pow" and config["call"]["args"] == ["2", "10"]
    # Nothing was submitted: no submitit pickles or job logs in the folder.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full-run.config.json", "full-run.sbatch"]


@pytest.mark.cluster("submitit")
def test_dry_run_keeps_unresolved_placeholders_visible(tmp_path, monkeypatch):
    monkeypatch.delenv("ZM_SLURM_PARTITION", raising=False)
    monkeypatch.delenv("ZM_SLURM_ACCOUNT", raising=False)
    result = submit(operator.pow, 2, 3, cluster="slurm", profile="h200-node", folder=tmp_path, dry_run=True)
    flags = _sbatch_flags(result.scripts[0].read_text())
    assert flags["partition"] == "'${ZM_SLURM_PARTITION}'"
    assert result.config["unresolved_placeholders"] == {
        "partition": "ZM_SLURM_PARTITION",
        "account": "ZM_SLURM_ACCOUNT",
    }
    # A real submission refuses before touching Slurm.
    with pytest.raises(ValueError, match=r"field 'partition' needs \$ZM_SLURM_PARTITION"):
        submit(operator.pow, 2, 3, cluster="slurm", profile="h200-node", folder=tmp_path)


@pytest.mark.cluster("submitit")
def test_dry_run_array_is_one_sbatch_array(tmp_path):
    result = submit(
        operator.pow, 2, cluster="slurm", profile="local-cpu", folder=tmp_path, job_name="sweep",
        array=[(1,), (2,), (3,)], dry_run=True,
    )  # fmt: skip
    script = result.scripts[0].read_text()
    flags = _sbatch_flags(script)
    assert flags["array"] == "0-2%3"
    assert flags["partition"] == "debug"
    assert flags["output"].endswith("%A_%a_0_log.out")
    # local-cpu asks for no GPUs, and says nothing about GPUs rather than "--gpus-per-node=0".
    assert "gpus-per-node" not in flags and "gres" not in flags
    assert "account" not in flags
    assert result.config["call"]["array"] == [["1"], ["2"], ["3"]]


@pytest.mark.cluster("submitit")
def test_dry_run_with_ray_starts_head_and_workers_and_runs_driver_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ZM_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("ZM_SLURM_ACCOUNT", "proj")
    result = submit(
        operator.pow, 2, 3, cluster="slurm", profile="h200-node", folder=tmp_path, nodes=2, ray=True,
        dry_run=True,
    )  # fmt: skip
    script = result.scripts[0].read_text()
    assert script.index("ray start --head") < script.index("-m submitit.core._submit")
    assert "--num-gpus=8" in script and "RAY_AUTH_MODE=token" in script
    assert 'for node in "${zm_ray_nodes[@]:1}"' in script
    # fn runs once, as one srun step on the head node (the allocation's first), where SIGUSR2 reaches it
    command_line = [line for line in script.splitlines() if "submitit.core._submit" in line]
    assert len(command_line) == 1 and command_line[0].startswith("srun")
    assert "--ntasks=1 --relative=0 --overlap --cpus-per-task=96" in command_line[0]
    # every srun names its CPUs (Slurm >= 22.05 steps do not inherit --cpus-per-task); Ray steps ignore USR2
    steps = [line for line in script.splitlines() if "srun " in line]
    assert steps and all("--cpus-per-task=" in line for line in steps)
    assert script.count('trap "" USR2') == 2 and "trap zm_ray_stop EXIT" in script
    assert "6379" not in script and "hostname --ip-address" not in script
    subprocess.run(["bash", "-n", str(result.scripts[0])], check=True)
    assert ray_slurm_setup_lines(tmp_path, gpus_per_node=8) == list(
        result.config["executor_parameters"]["slurm_setup"]
    )


@pytest.mark.cluster("submitit")
def test_dry_run_for_local_cluster_writes_config_only(tmp_path):
    result = submit(operator.pow, 2, 3, cluster="local", folder=tmp_path, dry_run=True)
    assert result.scripts == []
    assert json.loads(result.config_path.read_text())["cluster"] == "local"


@pytest.mark.cluster("submitit")
def test_local_executor_runs_in_a_subprocess(tmp_path):
    job = submit(os.getpid, cluster="local", folder=tmp_path, timeout_min=2)
    child_pid = job.result()
    assert isinstance(child_pid, int) and child_pid != os.getpid()
    assert (tmp_path / "getpid.config.json").exists()


@pytest.mark.cluster("submitit")
def test_debug_executor_runs_in_process_and_arrays_keep_order(tmp_path):
    job = submit(os.getpid, cluster="debug", folder=tmp_path)
    assert job.result() == os.getpid()
    jobs = submit(operator.pow, 2, cluster="debug", folder=tmp_path, array=[(3,), (5,), (10,)])
    assert [j.result() for j in jobs] == [8, 32, 1024]


@pytest.mark.cluster("submitit")
def test_profile_object_and_overrides(tmp_path):
    profile = load_profile("local-cpu")
    result = submit(
        operator.pow, 1, 1, cluster="slurm", profile=profile, folder=tmp_path, cpus_per_task=2, mem_gb=1.5,
        gpus_per_node=1, dry_run=True,
    )  # fmt: skip
    flags = _sbatch_flags(result.scripts[0].read_text())
    assert (flags["cpus-per-task"], flags["mem"], flags["gpus-per-node"]) == ("2", "1536MB", "1")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cluster": "kubernetes"}, ValueError, "cluster must be one of"),
        ({"cluster": "local", "nodes": 2}, ValueError, "nodes=2 needs cluster='slurm'"),
        ({"nodes": 0}, ValueError, "nodes must be an integer >= 1"),
        ({"gpus_per_node": -1}, ValueError, "gpus_per_node must be an integer >= 0"),
        ({"timeout_min": 2.5}, ValueError, "timeout_min must be an integer"),
        ({"mem_gb": 0}, ValueError, "mem_gb must be a number > 0"),
        ({"job_name": "two words"}, ValueError, "job_name must be"),
        ({"array": [1, 2]}, TypeError, "each array element must be a tuple"),
        ({"array": []}, ValueError, "at least one element"),
        ({"ray": True, "tasks_per_node": 2}, ValueError, "ray=True needs tasks_per_node=1"),
        ({"profile": "no-such-profile"}, ValueError, "unknown cluster profile 'no-such-profile'"),
    ],
)
def test_bad_arguments_raise_one_clear_error(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        submit(operator.pow, 2, 3, folder=tmp_path, dry_run=True, **kwargs)


def test_non_callable_is_rejected(tmp_path):
    with pytest.raises(TypeError, match="fn must be callable"):
        submit("not a function", folder=tmp_path, dry_run=True)


@pytest.mark.cluster("submitit")
def test_config_goes_above_a_per_job_folder(tmp_path):
    result = submit(
        operator.pow, 2, 3, cluster="slurm", folder=tmp_path / "%j", job_name="per-job", dry_run=True
    )
    assert result.config_path == tmp_path / "per-job.config.json"
    assert result.scripts == [tmp_path / "per-job.sbatch"]
    assert f"--output={tmp_path}/%j/%j_0_log.out" in result.scripts[0].read_text()


@pytest.mark.parametrize("script", ["setup.sh", "stop.sh"])
def test_local_slurm_scripts_parse(script):
    path = Path(__file__).resolve().parents[2] / "cluster" / "local_slurm" / script
    subprocess.run(["bash", "-n", str(path)], check=True)
