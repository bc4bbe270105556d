"""The full tier's code path end to end on the local Slurm: ``launch.py --scale full-smoke --cluster slurm``
submits an arm as a submitit job; the job starts a Ray cluster over its allocation and runs the arm with
a vLLM rollout actor and a Megatron learner actor (integrations/full_scale.py), checkpointing every step.

- One experiment arm through the real launcher: the job COMPLETED in sacct, kernel k3 exactly 0 at
  every step, and ``paper_figures/make_all.py`` reads the run (its training-curve figure).
- Faults inside one job: its rollout actor's process dies at batch 1 and its learner actor's at
  step 3 (each once: Ray restarts the one, the executor replaces the other from its last checkpoint),
  and then, once the learner's replacement is recorded, the job is interrupted by ``scancel
  --signal=USR2`` (what Slurm sends before the time limit), checkpointed through submitit's protocol,
  requeued, and resumes: every step once, the final weights equal to an uninterrupted run's.

Run with ``make vllm-test`` (in ``.venv-vllm``, which has vLLM, megatron-core and Ray) once
cluster/local_slurm/setup.sh has started a controller and ``SLURM_CONF`` is exported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from zeromismatch.experiment import Arm, Experiment, FullScale, run_experiment
from zeromismatch.rl import RLConfig
from zeromismatch.rl.actors import KILL_LEARNER_ENV, KILL_ROLLOUT_ENV

pytestmark = [
    pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slurm, pytest.mark.slow,
    pytest.mark.cluster("ray", "submitit"),
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _job_id(launcher_output: str) -> str:
    [line] = [line for line in launcher_output.splitlines() if " submitted; logs in " in line]
    return line.split(": job ")[1].split()[0]


def _sacct_states(job_id: str, timeout_s: float = 60.0) -> list[str]:
    """Every accounted incarnation's state (``--duplicates``: a requeued job keeps its earlier records),
    once slurmdbd has recorded the last one's end (recording lags the job's result)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sacct", "-j", job_id, "--duplicates", "-X", "-n", "-P", "-o", "State"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        states = [line.split()[0] for line in out.splitlines() if line.strip()]
        if states and states[-1] not in ("PENDING", "RUNNING", "COMPLETING") or time.monotonic() > deadline:
            return states
        time.sleep(1)


def test_an_experiment_arm_runs_end_to_end_on_slurm(slurm_controller, tmp_path):
    results = tmp_path / "results"
    launcher = ROOT / "experiments/reinforce_zero_lag64/launch.py"
    launch = [sys.executable, str(launcher), "--scale", "full-smoke", "--cluster", "slurm",
              "--out-root", str(results / "reproduced"), "--quiet"]  # fmt: skip
    done = subprocess.run([*launch, "--arms", "aligned_lag2"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = results / "reproduced/reinforce_zero_lag64/full-smoke/aligned_lag2"
    records = _records(run)
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["kernel_k3_kl"] == 0.0 and r["k3_kl"] == 0.0 for r in records)
    resolved = json.loads((run / "resolved.json").read_text())
    assert {k: resolved["config"][k] for k in ("executor", "rollout_engine", "trainer")} == {
        "executor": "ray", "rollout_engine": "vllm", "trainer": "megatron",
    }  # fmt: skip
    assert {"summary.json", "provenance.json", "manifest.json"} <= {p.name for p in run.iterdir()}
    if slurm_controller["accounting"]:
        assert _sacct_states(_job_id(done.stdout)) == ["COMPLETED"]

    # the inverse: a fast arm (stock bf16 rollout kernels) is one the path cannot serve, refused before
    # anything is submitted, in one line
    refused = subprocess.run([*launch, "--arms", "fast_lag2"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "cannot run there" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    # the report reads full-smoke runs like any other: a training-curve figure for the scale
    shutil.copytree(ROOT / "results/published", results / "published")
    project_python = ROOT / ".venv/bin/python"  # make_all needs the figures extra of the project venv
    if not project_python.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{project_python} is missing: make test builds it before the vLLM tests")
        pytest.skip(f"{project_python} is missing (make venv)")
    report = subprocess.run(
        [str(project_python), str(ROOT / "paper_figures/make_all.py"), "--results", str(results), "--quiet"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    assert (results / "figures/curves__reinforce_zero_lag64__full-smoke.png").is_file()


def _learning_arm() -> list[Arm]:
    # a warm start that leaves reward to learn (arithmetic, 40 SFT steps), so the weights move every step
    config = RLConfig(
        env="arithmetic", model="tiny-qwen3", env_options={"max_digits": 1}, sft_steps=40, steps=6, lag=1,
        prompts_per_step=4, group_size=4, seed=0, eval_size=8, eval_samples=0,
    )  # fmt: skip
    return [Arm("aligned", config, "requeue test")]


REQUEUE = Experiment(
    name="full_smoke_requeue",
    claim="a requeued full-tier job resumes to the uninterrupted weights",
    arms={"smoke": _learning_arm},
    full=FullScale(
        model="none",
        rollout_engine="vllm",
        trainer="megatron",
        gpus=None,
        nodes=1,
        updates=None,
        env="math-reasoning",  # the full scale's env; full-smoke runs the smoke arm's own
    ),  # fmt: skip
)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(0.5)


def test_a_requeued_job_with_killed_actors_resumes_to_the_uninterrupted_weights(
    slurm_controller, tmp_path, monkeypatch
):
    import ray

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each actor runs
    try:
        reference = run_experiment(REQUEUE, "full-smoke", out_root=tmp_path / "inline", quiet=True)["aligned"]
    finally:
        torch.set_num_threads(threads)
        ray.shutdown()  # the inline run started a local Ray in this process

    out = tmp_path / "slurm"
    # the job inherits the submitting environment (sbatch --export=ALL), and its driver hands these to
    # the actors: each dies once, for real (os._exit), where its marker file says it has not yet
    rollout_killed, learner_killed = tmp_path / "rollout_killed", tmp_path / "learner_killed"
    monkeypatch.setenv(KILL_ROLLOUT_ENV, f"1:{rollout_killed}")
    monkeypatch.setenv(KILL_LEARNER_ENV, f"3:{learner_killed}")
    finished: dict = {}
    submitter = threading.Thread(
        target=lambda: finished.update(run_experiment(REQUEUE, "full-smoke", cluster="slurm", out_root=out))
    )
    submitter.start()
    partial = out / "full_smoke_requeue/full-smoke/.aligned.partial"

    def learner_replaced() -> bool:
        # the faults in sequence: a USR2 sent while the driver has not yet seen its learner die (Ray takes
        # seconds to report a dead actor) ends the job first, and the requeue alone would be recorded
        try:
            restarts = json.loads((partial / "provenance.json").read_text()).get("restarts", [])
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return any(r.get("reason", "").startswith("learner actor died") for r in restarts)

    # the replacement starts a new vLLM rollout actor (tens of seconds) and has steps 3-5 left to run,
    # so the signal lands while the job still runs
    _wait_for(learner_replaced, 600, "the learner's replacement")
    folder = out / ".submitit/full_smoke_requeue"
    [config] = folder.glob("*.config.json")
    job_ids = sorted(p.name.split("_")[0] for p in folder.glob("*_submission.sh"))
    assert len(job_ids) == 1, job_ids
    job_id = job_ids[0]
    assert json.loads(config.read_text())["ray"] is True
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    submitter.join(timeout=900)
    assert not submitter.is_alive(), f"job {job_id} did not finish after its requeue"

    run = out / "full_smoke_requeue/full-smoke/aligned"
    summary = finished["aligned"]
    assert rollout_killed.exists() and learner_killed.exists()  # both actors did die
    assert [r["step"] for r in _records(run)] == list(range(6))  # every step once
    assert all(r["kernel_k3_kl"] == 0.0 for r in _records(run))
    provenance = json.loads((run / "provenance.json").read_text())
    # two restarts: the learner's replacement (from its last checkpoint), then the requeue's resume
    restarts = provenance["restarts"]
    assert len(restarts) == 2 and all(r["resumed_at_step"] >= 2 for r in restarts), restarts
    assert restarts[0]["reason"].startswith("learner actor died") and "reason" not in restarts[1], restarts
    # every step took a gradient, so equal weights are not the warm start surviving both runs unchanged
    assert all(r["grad_norm_preclip"] > 0 for r in _records(run))
    assert summary["weights_sha256"] == reference["weights_sha256"]
    if slurm_controller["accounting"]:
        states = _sacct_states(job_id)
        assert states[0] == "REQUEUED" and states[-1] == "COMPLETED", states
