"""The sampler's noise in C (kernels/native/random.c) is torch's CPU generator stream bit for bit:
every row equals ``manual_seed(seed)`` + ``uniform_`` for any seed (all 64 bits, including ones
that differ only above bit 32) and any length (inside one MT19937 block, at its edges, and across
several), any number of rows (inside and across the 16-lane groups); the engine sampler draws the
same tokens with it as with the torch loop it replaces."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.engine import SamplingParams
from zeromismatch.engine import sampler as sampler_module
from zeromismatch.engine.sampler import Sampler, mix_seed
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import random as native_random

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)


def _torch_rows(seeds: list[int], cols: int) -> torch.Tensor:
    generator = torch.Generator()
    rows = []
    for seed in seeds:
        generator.manual_seed(seed)
        rows.append(torch.empty(cols).uniform_(generator=generator))
    return torch.stack(rows) if rows else torch.empty(0, cols)


@pytest.mark.parametrize("cols", [1, 7, 512, 623, 624, 625, 1247, 1248, 1249, 3000])
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 40])
def test_rows_are_torch_generator_streams(rows, cols):
    gen = torch.Generator().manual_seed(rows * 10_000 + cols)
    seeds = [mix_seed(int(s), i) for i, s in enumerate(torch.randint(0, 2**62, (rows,), generator=gen))]
    out = native_random.uniform_rows(seeds, cols)
    assert out.dtype == torch.float32 and out.shape == (rows, cols)
    assert torch.equal(out, _torch_rows(seeds, cols))


@settings(max_examples=25, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20), cols=st.integers(0, 700))
def test_any_seed_and_length(seeds, cols):
    assert torch.equal(native_random.uniform_rows(seeds, cols), _torch_rows(seeds, cols))


def test_bad_seeds_and_empty_inputs():
    with pytest.raises(ValueError, match="seeds must lie in"):
        native_random.uniform_rows([1, -1], 4)
    with pytest.raises(ValueError, match="seeds must lie in"):
        native_random.uniform_rows([2**64], 4)
    assert native_random.uniform_rows([], 5).shape == (0, 5)
    assert native_random.uniform_rows([3], 0).shape == (1, 0)


@pytest.mark.parametrize("kernels", ["aligned", "default"])
def test_sampler_draws_the_same_tokens_as_the_torch_loop(monkeypatch, kernels):
    """Inverse included: a different stream (the seeds shifted by one) changes the tokens, so the
    equality is not vacuous."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(24, 300, generator=gen) * 3
    params = [SamplingParams(temperature=t, top_p=p, max_tokens=4) for t, p in [(1.0, 1.0), (0.7, 0.9)] * 12]
    seeds, indices = list(range(100, 124)), [i % 5 for i in range(24)]
    sample = Sampler(get_kernels(kernels))
    native = sample(logits, params, seeds, indices)
    monkeypatch.setattr(native_random, "uniform_rows_from", lambda seeds, cols: None)
    assert sampler_module.native_random.uniform_rows_from(torch.tensor([1]), 1) is None
    fallback = sample(logits, params, seeds, indices)
    assert native.token_ids == fallback.token_ids and native.logprobs == fallback.logprobs
    shifted = sample(logits, params, [s + 1 for s in seeds], indices)
    assert shifted.token_ids != fallback.token_ids


def test_sampler_refuses_mismatched_lengths():
    sample = Sampler(get_kernels("aligned"))
    params = [SamplingParams(max_tokens=1)] * 3
    with pytest.raises(ValueError, match="3 logit rows but 3 params, 1 seeds"):
        sample(torch.zeros(3, 8), params, [1], [0, 0, 0])


@pytest.mark.native
def test_uniform_rows_from_reads_an_int64_seed_tensor_and_refuses_others():
    seeds = [5, 2**63 + 7]  # above 2^63: stored as its uint64 bits in int64
    tensor = native_random.seed_tensor(seeds)
    assert tensor.dtype == torch.int64 and tensor[1] < 0
    assert torch.equal(native_random.uniform_rows_from(tensor, 9), _torch_rows(seeds, 9))
    for bad in (tensor.to(torch.int32), tensor.view(2, 1), torch.stack([tensor, tensor], 1)[:, 0]):
        with pytest.raises(ValueError, match="contiguous 1-D int64 CPU tensor"):
            native_random.uniform_rows_from(bad, 3)


def test_race_argmax_is_torchs_argmax_of_the_difference():
    """The sampler's race in one native pass (random.c's zm_race_argmax) picks torch.argmax's index of
    ``processed - log_e`` in every row: random rows, ties (the first wins), nan (the first nan wins),
    all -inf (index 0), and -0 against +0 (a tie)."""
    if not native_random.available():
        pytest.skip("native library unavailable")
    gen = torch.Generator().manual_seed(5)
    processed = torch.randn(64, 40, generator=gen)
    log_e = torch.randn(64, 40, generator=gen)
    processed[1] = 1.0  # ties everywhere
    log_e[1] = 0.0
    processed[2, [3, 7]] = float("nan")
    processed[3] = float("-inf")
    processed[4], log_e[4] = 0.0, 0.0
    processed[4, 0] = -0.0
    processed[5, 39] = float("nan")
    processed[6, 0] = float("nan")
    processed[7, 5] = float("inf")
    processed[7, 9] = float("inf")
    got = native_random.race_argmax(processed, log_e)
    assert torch.equal(got, torch.argmax(processed - log_e, dim=1))
    # what it does not take, it leaves to torch
    assert native_random.race_argmax(processed.double(), log_e.double()) is None
    assert native_random.race_argmax(processed.t(), log_e.t()) is None
