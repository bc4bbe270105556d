"""The Ray executor with a vLLM rollout actor and a Megatron learner actor, the full tier's shape
(``RLConfig(executor="ray", rollout_engine="vllm", trainer="megatron")``).

The rollout actor serves batches from a real vLLM (``integrations/vllm/engine.py``) while the
Megatron learner actor trains; the rollout actor's process is killed at the start of batch 2, once,
and Ray restarts it (a new vLLM starts in the new incarnation) and regenerates that batch. The run's
records and final weights must equal an uninterrupted in-process run (the project engine, the same
Megatron learner), every step exactly once: the plugin gives the project engine's bits, and a batch
is a function of its weights, index and seed only.

Run with ``make vllm-test`` (in ``.venv-vllm``, which has Ray).
"""

from __future__ import annotations

import json

import pytest
import torch

from zeromismatch.rl import RLConfig, train
from zeromismatch.rl.actors import KILL_ROLLOUT_ENV

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slow, pytest.mark.cluster("ray")]


def _records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time_")} for line in lines]


@pytest.fixture
def ray_session():
    import ray

    from zeromismatch.rl.actors import init_ray

    init_ray(num_cpus=2)  # one CPU per actor
    yield ray
    ray.shutdown()


def test_vllm_rollout_and_megatron_learner_actors_survive_a_killed_rollout_actor(
    tmp_path, ray_session, monkeypatch
):
    config = RLConfig(
        env="arithmetic", model="tiny-qwen3", env_options={"max_digits": 1}, sft_steps=40, steps=4, lag=1,
        prompts_per_step=4, group_size=4, seed=0, eval_size=8, eval_samples=0, trainer="megatron",
    )  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run one torch thread each
    try:
        reference = train(config, tmp_path / "inprocess", quiet=True)
    finally:
        torch.set_num_threads(threads)
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ROLLOUT_ENV, f"2:{marker}")
    summary = train(config.replace(executor="ray", rollout_engine="vllm"), tmp_path / "ray", quiet=True)
    assert marker.exists()  # the actor did die at batch 2
    assert summary["rollout_actor_restarts"] == 1
    records = _records(tmp_path / "ray")
    assert [r["step"] for r in records] == list(range(4))  # every batch once
    assert all(r["kernel_k3_kl"] == 0.0 for r in records)
    assert records == _records(tmp_path / "inprocess")
    assert summary["weights_sha256"] == reference["weights_sha256"]
