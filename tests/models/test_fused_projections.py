"""Fused q/k/v and gate/up projections (one GEMM over the concatenated weight) change no bit.

Fusing is a refactor, not an invariance claim: engine and trainer run the same module code, so
they fuse identically whatever the kernel set. What is checked here is that the fused model
computes exactly what the separate HF projections compute (``torch.equal``), for both kernel
sets, in trainer and engine mode, plus the weight cache's invalidation and autograd. (On this CPU
the stock GEMM also gives every output column the same bits whichever columns share the call, so
there is no default-set counterexample to show; the aligned set relies on it by construction, see
``kernels/aligned/gemm.py``.)
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import engine_logits, random_sequences, trainer_logits

from zeromismatch.models import TINY_PRESETS, build_model, layers

LENGTHS = [7, 4, 6]
CHUNKS = [3, 1, 2]


def _unfused(monkeypatch) -> None:
    monkeypatch.setattr(layers, "fused_linear", lambda *args: None)


@pytest.mark.parametrize("kernel_set", ["aligned", "default"])
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_fused_model_gives_the_bits_of_separate_projections(preset, kernel_set, monkeypatch):
    model = build_model(preset, kernels=kernel_set, seed=4)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=5)
    with torch.no_grad():
        fused_trainer = trainer_logits(model, sequences)
        fused_engine = engine_logits(model, sequences, CHUNKS)
        _unfused(monkeypatch)
        assert torch.equal(trainer_logits(model, sequences), fused_trainer)
        assert torch.equal(engine_logits(model, sequences, CHUNKS), fused_engine)


def test_fused_weight_cache_follows_weight_updates():
    model = build_model("tiny-qwen3", kernels="aligned", seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        before = trainer_logits(model, sequences)
        state = model.state_dict_hf()
        state["model.layers.0.self_attn.k_proj.weight"] *= 1.5
        state["model.layers.1.mlp.up_proj.weight"] *= 0.5
        model.load_state_dict_hf(state)
        after = trainer_logits(model, sequences)
        fresh = build_model("tiny-qwen3", kernels="aligned", seed=None)
        fresh.load_state_dict_hf(state)
        assert not torch.equal(after, before)
        assert torch.equal(after, trainer_logits(fresh, sequences))


def test_fused_projections_backpropagate_to_the_hf_parameters():
    model = build_model("tiny-qwen3", kernels="aligned", seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    trainer_logits(model, sequences).logsumexp(-1).sum().backward()
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
        assert linear.weight.grad is not None and bool(linear.weight.grad.abs().sum() > 0)


def test_copied_and_pickled_models_keep_their_own_fused_weights():
    """The cache is keyed by tensor identity: a clone computes the same bits, and changing the
    clone's weights never serves the original a stale or foreign concatenation."""
    import copy
    import pickle

    model = build_model("tiny-qwen3", kernels="aligned", seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert torch.equal(trainer_logits(clone, sequences), expected)
            clone.model.layers[0].self_attn.q_proj.weight.mul_(2.0)
            assert not torch.equal(trainer_logits(clone, sequences), expected)
            assert torch.equal(trainer_logits(model, sequences), expected)
