"""Shared warm starts: one SFT checkpoint, built once, that runs on different stacks start RL from."""

from __future__ import annotations

import json

import pytest
import torch
from rl_helpers import tiny_config

from zeromismatch.rl import train
from zeromismatch.rl.learner import Learner, weights_hash
from zeromismatch.rl.stacks import stack_fields
from zeromismatch.rl.trained import make_warm_start
from zeromismatch.rl.warm_start import (
    RECORD,
    apply_warm_start,
    recipe,
    recipe_key,
    sft_config,
    shared_warm_start,
)
from zeromismatch.train.checkpoint import CheckpointError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "warm_starts"
    monkeypatch.setenv("ZEROMISMATCH_WARM_START_DIR", str(root))
    return root


def shared(**changes):
    return tiny_config(warm_start="shared", sft_steps=3, sft_batch=4, steps=1, **changes)


def test_arms_on_different_stacks_start_from_one_warm_start(tmp_path, cache):
    aligned = train(shared(), tmp_path / "aligned", quiet=True)
    default = train(shared(kernels="default"), tmp_path / "default", quiet=True)
    fast = train(shared(**stack_fields("fast-bf16")), tmp_path / "fast", quiet=True)
    assert aligned["warm_start"] == default["warm_start"] == fast["warm_start"] == "shared"
    assert aligned["warm_start_sha256"] == default["warm_start_sha256"] == fast["warm_start_sha256"]
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1  # built once
    provenance = json.loads((tmp_path / "fast" / "provenance.json").read_text())
    assert provenance["warm_start"]["weights_sha256"] == fast["warm_start_sha256"]
    assert aligned["sft_final_loss"] == default["sft_final_loss"]


def test_inverse_own_warm_starts_differ_between_stacks():
    # the reason for sharing: the same recipe in the default kernels' numerics gives other weights
    hashes = []
    for kernels in ("aligned", "default"):
        config = tiny_config(sft_steps=3, sft_batch=4, kernels=kernels)
        torch.manual_seed(config.seed)
        learner = Learner(config)
        apply_warm_start(config, learner)
        hashes.append(weights_hash(learner.model))
    assert hashes[0] != hashes[1]


def test_the_shared_warm_start_is_the_fp32_aligned_sft_of_its_recipe(tmp_path, cache):
    config = shared(**stack_fields("fast-fp8"))
    start = shared_warm_start(config)
    reference = make_warm_start(sft_config(config), tmp_path / "reference")
    assert sft_config(config).kernels == "aligned" and sft_config(config).engine_quant == "none"
    assert start.sha256 == reference.weights_sha256
    assert json.loads((start.path / RECORD).read_text())["weights_sha256"] == start.sha256


def test_recipe_seed_decides_the_bits_and_rl_seed_does_not(cache):
    base = shared(sft_seed=0)
    assert recipe_key(recipe(base)) == recipe_key(recipe(base.replace(seed=5)))
    other = base.replace(sft_seed=1)
    assert recipe_key(recipe(other)) != recipe_key(recipe(base))
    assert shared_warm_start(other).sha256 != shared_warm_start(base).sha256


def test_a_corrupted_cache_is_refused_naming_it(cache):
    start = shared_warm_start(shared())
    state = start.path / "checkpoints" / "step_000000" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="shared warm start .*delete it to rebuild"):
        shared_warm_start(shared())


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(sft_seed=1), "sft_seed"),  # only for a shared warm start
        (dict(warm_start="shared", sft_steps=0), "warm_start"),
        (dict(warm_start="borrowed"), "warm_start"),
    ],
)
def test_bad_warm_start_settings_name_the_field(changes, field):
    with pytest.raises(ValueError, match=f"RLConfig.{field}"):
        tiny_config(**changes)
