"""FP8 e4m3 and NVFP4 quantize/dequantize: layout, exactness on representable values, error
bounds, bad input, and the quantized linear of both kernel sets.

Error bounds stated per test: fp8 e4m3 has 3 mantissa bits, so a scaled value rounds with
relative error <= 2^-4 (plus the subnormal floor 2^-9 * scale); e2m1 has 1 mantissa bit and a
top step of 2 (4 -> 6), so an NVFP4 element errs by <= 1 * block_scale (half the largest step).
"""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.base import QuantizedWeight
from zeromismatch.kernels.quant import (
    FP8_MAX,
    cached_dequantize,
    dequantize,
    quantize_activations_fp8_per_tensor,
    quantize_fp8,
    quantize_nvfp4,
    unpack_nvfp4_codes,
)

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")


def _randn(shape, seed=0, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_fp8_per_channel_layout_and_error():
    w = _randn((32, 48), 0, 3.0)
    q = quantize_fp8(w)
    assert q.format == "fp8" and q.data.dtype == torch.float8_e4m3fn and q.data.shape == (32, 48)
    assert q.scales.shape == (32, 1) and q.shape == (32, 48) and q.block is None
    assert torch.equal(q.scales[:, 0], w.abs().amax(1) / FP8_MAX)  # the same one division: exact
    err = (dequantize(q) - w).abs()
    assert (err <= w.abs() * 2**-4 + q.scales * 2**-9 + 1e-12).all()


def test_fp8_block_layout_handles_ragged_edges():
    w = _randn((40, 70), 1)
    q = quantize_fp8(w, block=(16, 32))
    assert q.scales.shape == (3, 3) and q.block == (16, 32)
    assert torch.equal(q.scales[2, 2], w[32:, 64:].abs().amax() / FP8_MAX)
    deq = dequantize(q)
    assert deq.shape == w.shape
    assert ((deq - w).abs() <= w.abs() * 2**-4 + q.scales.max() * 2**-9).all()


def test_fp8_representable_values_roundtrip_exactly():
    codes = torch.tensor([[448.0, -448.0, 1.0, 0.5, 0.0, -3.5, 240.0, 0.015625]])
    q = quantize_fp8(codes)
    assert torch.equal(dequantize(q), codes)


def test_nvfp4_layout_low_nibble_first_and_exact_values():
    positive = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    row = torch.tensor(positive + [-0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, 6.0])
    q = quantize_nvfp4(row[None, :])
    assert q.data.dtype == torch.uint8 and q.data.shape == (1, 8)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (1, 1)
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0
    codes = unpack_nvfp4_codes(q.data)[0].tolist()
    assert codes == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 7]
    assert q.data[0, 0].item() == (1 << 4) | 0  # element 0 in the low nibble, element 1 high
    torch.testing.assert_close(dequantize(q)[0], row, rtol=0, atol=1e-6)


def test_nvfp4_error_bound_and_global_scale():
    w = _randn((16, 64), 2, 2.0)
    q = quantize_nvfp4(w)
    assert torch.equal(q.global_scale, w.abs().amax() / (448 * 6))  # the same one division: exact
    block_scale = (q.scales.float() * q.global_scale).repeat_interleave(16, dim=1)
    # rounding to e2m1 errs by <= half the largest step (1.0) times the block scale, and the
    # fp8 rounding of the block scale may clip the block max slightly (2^-4 relative)
    assert ((dequantize(q) - w).abs() <= block_scale * 1.0 + w.abs() * 2**-4 + 1e-6).all()


def test_dequantize_to_bf16_is_fp32_rounded_once():
    q = quantize_nvfp4(_randn((8, 32), 3))
    assert torch.equal(dequantize(q, torch.bfloat16), dequantize(q).to(torch.bfloat16))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.zeros(4, 20))
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8(torch.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        quantize_fp8(torch.zeros(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="block"):
        quantize_fp8(torch.zeros(4, 4), block=(0, 4))
    bad = QuantizedWeight("int4", torch.zeros(2, 2), torch.ones(2, 1), (2, 2))
    with pytest.raises(ValueError, match="unknown quantization format"):
        dequantize(bad)
    with pytest.raises(TypeError, match="QuantizedWeight"):
        ALIGNED.quant_linear(torch.zeros(1, 4), torch.zeros(2, 4))


def test_cached_dequantize_tracks_in_place_updates():
    q = quantize_fp8(_randn((8, 16), 4))
    first = cached_dequantize(q, torch.float32)
    assert cached_dequantize(q, torch.float32) is first
    q.scales.mul_(2)
    assert torch.equal(cached_dequantize(q, torch.float32), first * 2)


@pytest.mark.parametrize("fmt", ["fp8", "fp8-block", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aligned_quant_linear_is_linear_on_the_dequantized_weight(fmt, dtype):
    w = _randn((48, 64), 5)
    q = {"fp8": quantize_fp8(w), "fp8-block": quantize_fp8(w, (16, 16)), "nvfp4": quantize_nvfp4(w)}[fmt]
    x = _randn((2, 3, 64), 6).to(dtype)
    bias = _randn((48,), 7).to(dtype)
    out = ALIGNED.quant_linear(x, q, bias)
    assert out.shape == (2, 3, 48) and out.dtype == dtype
    assert torch.equal(out, ALIGNED.linear(x, dequantize(q, dtype), bias))


@pytest.mark.parametrize("fmt", ["fp8", "fp8-block", "nvfp4"])
def test_default_quant_linear_is_close_to_the_weight_only_result(fmt):
    # different numerics (activations quantized too), same function within quantization error
    w = _randn((48, 64), 5)
    q = {"fp8": quantize_fp8(w), "fp8-block": quantize_fp8(w, (16, 16)), "nvfp4": quantize_nvfp4(w)}[fmt]
    x = _randn((4, 64), 6)
    ref = x @ dequantize(q).T
    rel = 0.15 if fmt == "nvfp4" else 0.03  # relative to the output scale
    assert (DEFAULT.quant_linear(x, q) - ref).abs().max() <= rel * ref.abs().max()


def test_default_fp8_activation_scale_spans_the_batch():
    x = torch.cat([_randn((1, 32), 1), _randn((1, 32), 2, 100.0)])
    _, scale = quantize_activations_fp8_per_tensor(x)
    _, scale_alone = quantize_activations_fp8_per_tensor(x[:1])
    assert scale > scale_alone


def test_inference_tensors_are_not_cached_but_work():
    with torch.inference_mode():
        q = quantize_fp8(_randn((8, 16), 5))
        w = _randn((10, 16), 6).to(torch.bfloat16)
        h = _randn((2, 16), 7).to(torch.bfloat16)
        assert torch.equal(cached_dequantize(q, torch.float32), dequantize(q))
        assert torch.equal(ALIGNED.lm_head(h, w), ALIGNED.lm_head(h.float(), w.float()))
