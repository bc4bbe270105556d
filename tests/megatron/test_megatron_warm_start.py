"""A shared warm start with ``trainer="megatron"``: it is trained by the project's trainer in the
reference numerics (``rl/warm_start.py``, ``REFERENCE_TRAINER``), so a Megatron run and a run on the
project's trainer with one recipe share one key and one checkpoint, record the same
``warm_start_sha256``, and the Megatron run's first step has zero mismatch against the engine. The
keys recorded in results/ do not change (the recipe does not name the trainer). Inverse: a Megatron
run's own warm start, trained by Megatron's backward, is other weights."""

from __future__ import annotations

import json

import pytest
import torch

from zeromismatch.rl import RLConfig, train
from zeromismatch.rl.learner import Learner, weights_hash
from zeromismatch.rl.stacks import stack_fields
from zeromismatch.rl.warm_start import (
    REFERENCE_TRAINER,
    apply_warm_start,
    recipe,
    recipe_key,
    sft_config,
    shared_warm_start,
)

pytestmark = pytest.mark.megatron

TINY = dict(env="arithmetic", steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, eval_size=2,
            eval_samples=1, micro_batch_size=4, sft_steps=3, sft_batch=4)  # fmt: skip

#: the config of results/reproduced/deepseek_v4_flash_100steps/mini/aligned/seed0 (a committed run,
#: written before RLConfig had a trainer field) and the warm_start_key its summary.json records
COMMITTED = dict(
    env="tools", model="tiny-deepseek-v3", kernels="aligned-native", quant="fp8-block", seed=0, sft_seed=0,
    sft_steps=300, sft_batch=16, sft_lr=0.001, micro_batch_size=16, grad_clip=1.0, lr=0.0001, steps=150,
    prompts_per_step=8, group_size=4, max_new_tokens=24, eval_every=25, eval_size=64, eval_samples=2,
    warm_start="shared",
)  # fmt: skip
COMMITTED_KEY = "f457c9d98dc8cd48"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "warm_starts"
    monkeypatch.setenv("ZEROMISMATCH_WARM_START_DIR", str(root))
    return root


def test_committed_keys_are_unchanged_and_do_not_name_the_trainer():
    committed = RLConfig(**COMMITTED)
    assert recipe_key(recipe(committed)) == COMMITTED_KEY
    megatron = committed.replace(trainer="megatron")
    assert recipe(megatron) == recipe(committed) and recipe_key(recipe(megatron)) == COMMITTED_KEY
    assert "trainer" not in json.dumps(recipe(megatron))
    # the warm start itself is always trained by the reference trainer
    assert sft_config(megatron).trainer == REFERENCE_TRAINER == "zeromismatch"
    assert sft_config(megatron) == sft_config(committed)


def test_a_megatron_learner_loads_the_shared_warm_start_bits(cache):
    config = RLConfig(trainer="megatron", warm_start="shared", **TINY)
    start = shared_warm_start(config)
    for trainer in ("megatron", "zeromismatch"):
        learner = Learner(config.replace(trainer=trainer))
        record = apply_warm_start(config.replace(trainer=trainer), learner)
        assert (record["warm_start_key"], record["warm_start_sha256"]) == (start.key, start.sha256)
        assert weights_hash(learner.model) == start.sha256
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1  # built once


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _own_warm_start_hash(config: RLConfig) -> str:
    torch.manual_seed(config.seed)  # as the shared build seeds its SFT (warm_start.build_warm_start)
    learner = Learner(config)
    apply_warm_start(config, learner)
    return weights_hash(learner.model)


def test_megatron_and_project_runs_share_one_warm_start_and_start_at_zero_mismatch(tmp_path, cache):
    # the Megatron run comes first, so it is the one that builds the shared warm start
    megatron = train(RLConfig(trainer="megatron", warm_start="shared", **TINY), tmp_path / "megatron",
                     quiet=True)  # fmt: skip
    project = train(RLConfig(warm_start="shared", **TINY), tmp_path / "project", quiet=True)
    quantized = RLConfig(trainer="megatron", warm_start="shared", **TINY, **stack_fields("aligned-nvfp4"))
    nvfp4 = train(quantized, tmp_path / "nvfp4", quiet=True)
    for summary in (megatron, nvfp4):
        assert summary["warm_start"] == "shared"
        assert summary["warm_start_key"] == project["warm_start_key"]
        assert summary["warm_start_sha256"] == project["warm_start_sha256"]
        assert summary["sft_final_loss"] == project["sft_final_loss"]
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1  # built once
    for name in ("megatron", "nvfp4"):
        first = _metrics(tmp_path / name)[0]
        assert first["step"] == 0 and first["k3_kl"] == 0.0 and first["diff_max"] == 0.0
    provenance = json.loads((tmp_path / "megatron" / "provenance.json").read_text())
    assert provenance["warm_start"]["key"] == project["warm_start_key"]
    # built by the project's trainer: the bits of its own SFT of the recipe; inverse: the Megatron
    # learner's own SFT of the same recipe (Megatron's backward, not bitwise) is other weights
    assert _own_warm_start_hash(RLConfig(**TINY)) == project["warm_start_sha256"]
    assert _own_warm_start_hash(RLConfig(trainer="megatron", **TINY)) != project["warm_start_sha256"]
