"""Engine mode (paged KV cache, chunked prefill, decode, conv/SSM state) vs trainer mode.

One smoke check per family here (the full parity chain belongs to the engine tests):
sequences fed in mixed chunks -- one sequence by chunked prefill, one a token at a time, one in
chunks of 3 -- batched together every step over a shuffled paged cache, must give the
trainer's logits: within 1e-5 with the stock-torch reference kernels, bit for bit with the
aligned kernels. The inverse test shows the default kernels do not give the same bits.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import engine_logits, random_sequences, trainer_logits
from reference_kernels import ReferenceKernels

from zeromismatch.models import TINY_PRESETS, ForwardBatch, build_model

ENGINE_TOLERANCE = 1e-5  # fp32, reference kernels; measured about 1e-6
LENGTHS = [7, 4, 6]
CHUNKS = [3, 1, 2]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_engine_matches_trainer_reference_kernels(preset):
    model = build_model(preset, kernels=ReferenceKernels(), seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        got = engine_logits(model, sequences, CHUNKS)
    assert (got - expected).abs().max().item() <= ENGINE_TOLERANCE


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_engine_matches_trainer_bitwise_aligned(preset):
    model = build_model(preset, kernels="aligned", seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        assert torch.equal(engine_logits(model, sequences, CHUNKS), expected)


@pytest.mark.slow
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_engine_matches_trainer_bitwise_aligned_other_schedules(preset):
    model = build_model(preset, kernels="aligned", seed=2)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=3)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        for chunks, block_size in (([1, 1, 1], 3), ([4, 6, 2], 8)):
            assert torch.equal(engine_logits(model, sequences, chunks, block_size=block_size), expected)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_engine_matches_trainer_bitwise_aligned_bf16(preset):
    model = build_model(preset, kernels="aligned", seed=1, dtype=torch.bfloat16)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        assert expected.dtype == torch.float32
        assert torch.equal(engine_logits(model, sequences, CHUNKS), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_kernels_break_engine_trainer_bitwise_parity(dtype):
    """Inverse: with the default set the same schedule does not reproduce the trainer's bits."""
    model = build_model("tiny-qwen3", kernels="default", seed=1, dtype=dtype)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        got = engine_logits(model, sequences, CHUNKS)
    assert not torch.equal(got, expected)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_engine_matches_trainer_default_kernels_within_tolerance(preset):
    model = build_model(preset, kernels="default", seed=1)
    sequences = random_sequences(LENGTHS, model.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        got = engine_logits(model, sequences, CHUNKS)
    assert (got - expected).abs().max().item() <= ENGINE_TOLERANCE


def test_prefix_caching_support_flags():
    assert build_model("tiny-qwen3", kernels=ReferenceKernels()).supports_prefix_caching
    assert build_model("tiny-deepseek-v3", kernels=ReferenceKernels()).supports_prefix_caching
    assert not build_model("tiny-nemotron-h", kernels=ReferenceKernels()).supports_prefix_caching


def test_cache_layout():
    model = build_model("tiny-nemotron-h", kernels=ReferenceKernels())
    cache = model.allocate_cache(num_blocks=6, block_size=4, max_seqs=3)
    kinds = model.config.layer_kinds()  # M * M - E
    assert [k is not None for k in cache.k_cache] == [kind == "full_attention" for kind in kinds]
    assert cache.k_cache[1].shape == (6, 4, 2, 64)
    assert cache.conv_state[0].shape == (3, 256 + 2 * 2 * 16, 3)
    assert cache.ssm_state[0].shape == (3, 4, 64, 16) and cache.ssm_state[0].dtype == torch.float32
    mla = build_model("tiny-deepseek-v3", kernels=ReferenceKernels()).allocate_cache(2, 4, 1)
    assert mla.k_cache[0].shape == (2, 4, 4, 64) and mla.v_cache[0].shape == (2, 4, 4, 64)


def test_bad_batches_raise_clear_errors():
    model = build_model("tiny-nemotron-h", kernels=ReferenceKernels())
    seq = torch.arange(5)
    partial = ForwardBatch(seq, seq.clone(), torch.tensor([0, 5]), torch.tensor([8]))
    with pytest.raises(ValueError, match="trainer mode"):
        model(partial)
    cache = model.allocate_cache(4, 4, 2)
    with pytest.raises(ValueError, match="block_table and batch.slot_mapping"):
        model(ForwardBatch.for_training([seq]), cache)
    with pytest.raises(ValueError, match="outside"):
        model(ForwardBatch.for_training([torch.tensor([0, 512])]))
    with pytest.raises(TypeError, match="ForwardBatch"):
        model(seq)
    batch = ForwardBatch.for_training([seq])
    batch.block_table = torch.tensor([[0, 1]])
    batch.slot_mapping = torch.arange(5)
    with pytest.raises(ValueError, match="state_slots"):
        model(batch, cache)


@functools.cache
def _aligned_model(preset: str):
    return build_model(preset, kernels="aligned", seed=7)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(
    preset=st.sampled_from(["tiny-qwen3", "tiny-nemotron-h"]),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    chunk_seed=st.integers(0, 2**16),
    block_size=st.sampled_from([1, 2, 3, 4, 8]),
)
def test_engine_schedules_are_bitwise_aligned(preset, lengths, chunk_seed, block_size):
    """Any mix of chunk sizes and block sizes gives the trainer's bits (aligned kernels)."""
    model = _aligned_model(preset)
    gen = torch.Generator().manual_seed(chunk_seed)
    chunks = [int(c) for c in torch.randint(1, 6, (len(lengths),), generator=gen)]
    sequences = random_sequences(lengths, model.config.vocab_size, seed=chunk_seed)
    with torch.no_grad():
        expected = trainer_logits(model, sequences)
        got = engine_logits(model, sequences, chunks, block_size=block_size, seed=chunk_seed)
    assert torch.equal(got, expected)
