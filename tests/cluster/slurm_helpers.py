"""What the Slurm-marked tests share: whether a controller answers, and a job's result and accounted state."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest


def slurm_unavailable_reason() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is unset; start a controller with cluster/local_slurm/setup.sh and export it"
    if not os.path.isfile(os.environ["SLURM_CONF"]):
        # Slurm clients would retry a missing config for 60 s before failing.
        return f"SLURM_CONF={os.environ['SLURM_CONF']} is not a file"
    missing = [tool for tool in ("scontrol", "sinfo", "sbatch") if shutil.which(tool) is None]
    if missing:
        return f"Slurm client tools are not on PATH: {', '.join(missing)}"
    # scontrol ping answers at once when the controller is down; sinfo would retry for ~9 s.
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if ping.returncode != 0:
        said = (ping.stdout.strip().splitlines() or [ping.stderr.strip()])[0]
        return f"no Slurm controller answers ({said})"
    try:
        answer = subprocess.run(["sinfo", "-h", "-o", "%P %T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s"
    if answer.returncode != 0:
        return f"sinfo failed: {answer.stderr.strip() or answer.returncode}"
    if not answer.stdout.strip():
        return "sinfo lists no partitions"
    return None


def accounting_enabled() -> bool:
    answer = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10)
    return "accounting_storage/slurmdbd" in answer.stdout


def result_of(job, timeout_s: float = 120.0):
    """The job's result, or a failure that shows its stderr and cancels it after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} not done after {timeout_s} s; stderr:\n{job.stderr() or ''}")
        time.sleep(0.5)
    return job.result()


def accounted_state(job, timeout_s: float = 30.0) -> str:
    """The state sacct reports once slurmdbd has recorded the job's end (recording lags the result)."""
    deadline = time.monotonic() + timeout_s
    state = job.get_info(mode="force").get("State", "UNKNOWN")
    while state in ("PENDING", "RUNNING", "COMPLETING", "UNKNOWN") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = job.get_info(mode="force").get("State", "UNKNOWN")
    return state
