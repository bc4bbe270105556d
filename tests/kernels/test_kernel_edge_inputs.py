"""Edge cases found in review: small value head dims in attention, fp64 gated RMSNorm under
autograd, sampling-parameter validation, the dequantization cache, non-finite weights in
quantization, the NVFP4 tie rule, and bad shapes / types in linear and MoE routing.

Invariance checks use ``torch.equal``; the attention one has an inverse test on the default set.
"""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels import get_kernels, quant
from zeromismatch.kernels.quant import cached_dequantize, dequantize, quantize_fp8, quantize_nvfp4

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")


# ---- attention with a small value head dim -------------------------------------------------------
def _phases(kernels, dqk: int, dv: int, dtype, seed: int, length: int = 130, hq: int = 2, hkv: int = 2):
    """One sequence's attention output three ways: full prefill, chunked prefill (chunks of 37),
    and paged decode of the last 40 tokens (one batched call, every query its own "sequence"
    over one shuffled 16-slot block table; unused cache slots hold nan)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hq, dqk, generator=gen).to(dtype)
    k = torch.randn(length, hkv, dqk, generator=gen).to(dtype)
    v = torch.randn(length, hkv, dv, generator=gen).to(dtype)
    scale = dqk**-0.5

    def cu(*ends: int) -> torch.Tensor:
        return torch.tensor([0, *ends], dtype=torch.int64)

    full = kernels.attention(q, k, v, cu(length), cu(length), scale)
    parts = []
    for start in range(0, length, 37):
        end = min(length, start + 37)
        parts.append(kernels.attention(q[start:end], k[:end], v[:end], cu(end - start), cu(end), scale))
    chunked = torch.cat(parts)

    block = 16
    n_blocks = -(-length // block)
    order = torch.randperm(n_blocks + 2, generator=gen)[:n_blocks]
    k_cache = torch.full((n_blocks + 2, block, hkv, dqk), float("nan"), dtype=dtype)
    v_cache = torch.full((n_blocks + 2, block, hkv, dv), float("nan"), dtype=dtype)
    pos = torch.arange(length)
    k_cache[order[pos // block], pos % block] = k
    v_cache[order[pos // block], pos % block] = v
    decode_pos = torch.arange(length - 40, length)
    table = order[None, :].expand(decode_pos.numel(), n_blocks)
    decoded = kernels.paged_attention(
        q[decode_pos], k_cache, v_cache, table, torch.arange(decode_pos.numel() + 1), decode_pos + 1, scale
    )
    return full, chunked, decoded, decode_pos


@pytest.mark.parametrize("dqk", [8, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_aligned_attention_small_value_dim_is_phase_invariant(dqk, dtype):
    for seed in range(2):
        full, chunked, decoded, decode_pos = _phases(ALIGNED, dqk, 8, dtype, seed)
        assert torch.equal(chunked, full)
        assert torch.equal(decoded, full[decode_pos])


def test_default_attention_small_value_dim_is_not_phase_invariant():
    def breaks(seed: int) -> bool:
        full, chunked, decoded, decode_pos = _phases(DEFAULT, 24, 8, torch.float32, seed)
        return not (torch.equal(chunked, full) and torch.equal(decoded, full[decode_pos]))

    assert any(breaks(seed) for seed in range(8))


def test_aligned_attention_small_value_dim_is_accurate():
    """fp32 vs a float64 reference: max |err| <= 1e-5 (the zero-padded P@V columns add nothing)."""
    full, _, _, _ = _phases(ALIGNED, 24, 8, torch.float32, 0, length=70, hq=4, hkv=2)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(70, 4, 24, generator=gen).double()
    k = torch.randn(70, 2, 24, generator=gen).double().repeat_interleave(2, 1)
    v = torch.randn(70, 2, 8, generator=gen).double().repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * 24**-0.5
    scores = scores.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    assert (full.double() - ref).abs().max() <= 1e-5


# ---- gated RMSNorm in fp64 -------------------------------------------------------------------------
def test_fp64_gated_rms_norm_same_bits_with_and_without_autograd():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=gen, dtype=torch.float64)
    gate = torch.randn(5, 64, generator=gen, dtype=torch.float64)
    weight = 1 + 0.1 * torch.randn(64, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        engine = ALIGNED.gated_rms_norm(x, gate, weight, 1e-6, 32)
    trainer = ALIGNED.gated_rms_norm(x.requires_grad_(), gate.requires_grad_(), weight, 1e-6, 32)
    assert engine.dtype == trainer.dtype == torch.float64
    assert torch.equal(engine, trainer.detach())


# ---- processed_log_softmax parameter validation ------------------------------------------------------
def _processed(logits, temperature, top_k=0, top_p=1.0):
    n = logits.shape[0]
    return ALIGNED.processed_log_softmax(
        logits,
        torch.full((n,), float(temperature)),
        top_k if isinstance(top_k, torch.Tensor) else torch.full((n,), top_k, dtype=torch.int64),
        torch.full((n,), float(top_p)),
    )


def test_nan_top_p_is_rejected():
    with pytest.raises(ValueError, match="top_p"):
        _processed(torch.randn(2, 10), 1.0, top_p=float("nan"))


def test_floating_top_k_is_rejected():
    with pytest.raises(TypeError, match="top_k"):
        _processed(torch.randn(1, 10), 1.0, top_k=torch.tensor([2.7]))


@pytest.mark.parametrize("temperature", [1e-38, 1e-45])
def test_temperature_that_overflows_the_logits_is_rejected(temperature):
    logits = torch.tensor([[25.0, 24.0, -3.0, 10.0]])
    with pytest.raises(ValueError, match="temperature"):
        _processed(logits, temperature)
    with pytest.raises(ValueError, match="temperature"):
        _processed(logits, temperature, top_k=2, top_p=0.9)


def test_small_temperature_without_overflow_and_masked_logits_still_work():
    logits = torch.tensor([[25.0, 24.0, -3.0, float("-inf")], [1.0, 2.0, 3.0, 4.0]])
    out = _processed(logits, 1e-30)
    assert torch.isfinite(out[:, :3]).all() and out[0, 3] == float("-inf") and out[1, 3] == 0
    # finite scaled logits whose row sum overflows are fine (the screen's exact re-check)
    big = _processed(torch.tensor([[3e38, 3e38, 1.0]]), 0.99)
    assert big[0, :2].tolist() == [-0.6931471824645996] * 2 and torch.isfinite(big).all()
    # a greedy row never divides, so its logits may be huge
    greedy = ALIGNED.processed_log_softmax(
        torch.tensor([[3e38, 1.0], [1.0, 2.0]]),
        torch.tensor([0.0, 1.0]),
        torch.zeros(2, dtype=torch.long),
        torch.ones(2),
    )
    assert greedy[0].tolist() == [0.0, float("-inf")] and torch.isfinite(greedy[1]).all()


# ---- the dequantization cache -------------------------------------------------------------------------
def _counting_dequantize(monkeypatch) -> list[int]:
    calls = [0]
    plain = quant.dequantize

    def counted(*args, **kwargs):
        calls[0] += 1
        return plain(*args, **kwargs)

    monkeypatch.setattr(quant, "dequantize", counted)
    return calls


def test_dequantize_cache_hits_for_more_than_eight_weights_in_turn(monkeypatch):
    weights = [
        quantize_fp8(torch.randn(32, 64, generator=torch.Generator().manual_seed(i))) for i in range(12)
    ]
    calls = _counting_dequantize(monkeypatch)
    first = [cached_dequantize(q, torch.float32) for q in weights]
    assert calls[0] == len(weights)
    for _ in range(2):
        again = [cached_dequantize(q, torch.float32) for q in weights]
        assert all(a is b for a, b in zip(again, first))
    assert calls[0] == len(weights)  # every later call was a hit
    assert all(torch.equal(c, dequantize(q)) for c, q in zip(first, weights))


@pytest.mark.parametrize("tensor", ["data", "scales", "global_scale"])
def test_dequantize_cache_sees_in_place_writes_to_every_tensor(tensor):
    q = quantize_nvfp4(torch.randn(8, 32, generator=torch.Generator().manual_seed(3)))
    before = cached_dequantize(q, torch.float32).clone()
    if tensor == "data":
        q.data.bitwise_xor_(0x11)  # flips every code's lowest magnitude bit
    elif tensor == "scales":
        q.scales.copy_((q.scales.float() * 2).to(q.scales.dtype))
    else:
        q.global_scale.mul_(2)
    after = cached_dequantize(q, torch.float32)
    assert not torch.equal(after, before)
    assert torch.equal(after, dequantize(q))


# ---- quantization of non-finite weights ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("quantize", [quantize_fp8, quantize_nvfp4], ids=["fp8", "nvfp4"])
def test_quantizing_a_non_finite_weight_raises(quantize, bad):
    w = torch.randn(2, 16)
    w[0, 3] = bad
    with pytest.raises(ValueError, match="non-finite"):
        quantize(w)


def test_nvfp4_ties_round_to_nearest_even_as_documented():
    """Pins the rule (docs/parity.md, hardware cvt.rn e2m1): a midpoint goes to the even code."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + [6.0] * 9)
    w = torch.stack([mids, torch.full((16,), 6 * 448.0)])  # global scale 1, first block scale 1
    q = quantize_nvfp4(w)
    assert q.global_scale.item() == 1.0 and q.scales[0, 0].float().item() == 1.0
    assert dequantize(q)[0, :7].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


# ---- bad shapes / types ---------------------------------------------------------------------------------
def test_linear_with_empty_reduction_raises_value_error():
    with pytest.raises(ValueError, match="in-dim"):
        ALIGNED.linear(torch.zeros(3, 0), torch.zeros(4, 0))


@pytest.mark.parametrize("top_k", [2.5, True])
def test_moe_route_non_integer_top_k_raises_type_error(top_k):
    with pytest.raises(TypeError, match="top_k"):
        ALIGNED.moe_route(torch.randn(2, 8), top_k)
