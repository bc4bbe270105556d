"""Who/what/where produced a result: git commit, versions, hardware, command line."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

_PACKAGES = ("torch", "numpy", "safetensors", "transformers", "ray", "submitit", "wandb", "seaborn")


UNTRACKED_LISTED = 10  # names of untracked code files recorded in provenance (the count is exact)


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """The checkout's commit (with ``-dirty`` if its code has uncommitted changes), or "unknown".

    Code means every tracked file, plus untracked (not git-ignored) ``*.py`` files: a new module
    that is imported changes what runs just as an edit does. ``results/`` is left out of the check:
    a reproduction writes there (and replaces the runs it reruns), so counting it would mark every
    run after the first of ``make reproduce`` dirty."""
    return git_state(cwd)[0]


_PROCESS_STATE: tuple[str, list[str] | None] | None = None
# set when the frozen checkout is not the one the package was imported from (an editable install from
# another clone): the code that ran is that clone's, so its state is recorded beside the checkout's
_PACKAGE_STATE: dict[str, str] | None = None


def freeze_git_state(where: str | os.PathLike | None = None) -> None:
    """Take the git state of the checkout holding ``where`` now and report it for the rest of the process.

    ``where`` is what ran: a launcher passes its configs' directory, so a run records the checkout whose
    configs it ran, not the one the package was imported from; default: the package's own checkout
    (its code is what ran, e.g. ``zm train`` or the learnability suite, whose cases live in it).
    A process runs the code it imported, not what the checkout holds later: a suite that runs for an
    hour while someone commits or edits used to record each run's commit as HEAD at that run's start
    (a later commit, or "-dirty") for code it had loaded before. Entry points call this first; without
    it the first call takes the snapshot of the package's checkout."""
    global _PROCESS_STATE, _PACKAGE_STATE
    package_dir = Path(__file__).resolve().parent
    _PROCESS_STATE = _local_git_state(Path(where) if where is not None else package_dir)
    _PACKAGE_STATE = None
    if where is not None:
        from .checkout import git_toplevel

        package_top = git_toplevel(package_dir)
        if package_top is not None and package_top != git_toplevel(where):
            _PACKAGE_STATE = {"path": str(package_dir), "git_commit": _local_git_state(package_dir)[0]}


def git_state(cwd: str | os.PathLike | None = None) -> tuple[str, list[str] | None]:
    """``(git_commit, untracked code files)``; the list is None when git could not be asked.
    Without ``cwd`` it is the process's snapshot (``freeze_git_state``)."""
    if cwd is None:
        if _PROCESS_STATE is None:
            freeze_git_state()
        local, untracked = _PROCESS_STATE
    else:
        local, untracked = _local_git_state(Path(cwd))
    # a copy of the tree run elsewhere (a device or cluster job) may carry a stale or no .git: the
    # launcher can state which commit it copied; that is its claim, so the value says where it came from
    stated = os.environ.get("ZEROMISMATCH_GIT_COMMIT", "").strip()
    commit = f"{stated} (stated by ZEROMISMATCH_GIT_COMMIT; local git: {local})" if stated else local
    return commit, untracked


def _git(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True
    ).stdout


def _local_git_state(where: Path) -> tuple[str, list[str] | None]:
    try:
        commit = _git(where, "rev-parse", "HEAD").strip()
        changed = _git(
            where, "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)results"
        ).strip()
        others = _git(where, "ls-files", "--others", "--exclude-standard", "--full-name", "--", ":/")
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    untracked = sorted(
        name for name in others.splitlines() if name.endswith(".py") and not name.startswith("results/")
    )
    return commit + ("-dirty" if changed or untracked else ""), untracked


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def hardware() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def numerics() -> dict[str, object]:
    """Process-wide switches that change which kernels run (and so, possibly, the bits), and the
    native kernel builds this process loaded (compiler, flags), if any."""
    from .kernels.aligned.gemm import gemm_tile_rows
    from .kernels.native._build import loaded_builds

    info: dict[str, object] = {"gemm_tile_rows": gemm_tile_rows()}
    builds = loaded_builds()
    if builds:
        info["native_builds"] = builds
    return info


def config_hash(config: object) -> str:
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def provenance(config: object | None = None, argv: list[str] | None = None) -> dict[str, object]:
    from . import __version__

    commit, untracked = git_state()
    record: dict[str, object] = {
        "zeromismatch_version": __version__,
        "git_commit": commit,
        "untracked_code": None
        if untracked is None
        else {"count": len(untracked), "files": untracked[:UNTRACKED_LISTED]},
        "command_line": list(sys.argv if argv is None else argv),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "hardware": hardware(),
        "numerics": numerics(),
        "config_hash": config_hash(config) if config is not None else None,
    }
    if _PACKAGE_STATE is not None:
        record["package_checkout"] = dict(_PACKAGE_STATE)
    return record


def run_provenance(config) -> dict:
    """``provenance`` of an RL run: its kernel sets are resolved first, so a native set's build
    (compiler, flags) is loaded and recorded under ``numerics`` even before the run uses it."""
    from .kernels import get_kernels

    for name in {config.kernels, config.engine_kernels}:
        get_kernels(name)
    record = provenance(config.to_dict())
    # each side's numerics spelled out (the config holds them as "same as the learner" defaults)
    record["sides"] = {
        "learner": {"kernels": config.kernels, "dtype": config.dtype, "quant": config.quant,
                    "master_weights": config.dtype, "lm_head": "fp32"},
        "rollout": {"kernels": config.engine_kernels, "dtype": config.engine_dtype,
                    "quant": config.engine_quant, "kv_cache_dtype": config.kv_cache_dtype,
                    "lm_head": config.rollout_lm_head},
        "aligned": config.aligned_numerics,
    }  # fmt: skip
    return record
