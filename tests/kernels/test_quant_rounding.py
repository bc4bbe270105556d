"""The three weight formats' rounding against an independent float64 reference.

The reference enumerates the e4m3 (float8_e4m3fn) and e2m1 grids from their bit layouts in float64
and rounds to the nearest grid value, a tie to the even code (mantissa bit 0), saturating at 448 /
6, keeping the sign: what PTX ``cvt.rn.satfinite`` does. Inputs: random, exact midpoints (ties),
subnormals, values past saturation, zeros. End to end, quantize_fp8 / quantize_nvfp4 are compared
with the reference applied to the exact (float64) scaled values; an element whose float64 value
lies within a few fp32 ulps of a midpoint may round either way (the implementation rounds the
scaled value to fp32 first) and only has to land on one of its two neighbours.

The scale rules are vLLM's (vllm-project/vllm), cited by function name where each is checked:
``dynamic_per_token_scaled_fp8_quant`` (csrc/quantization/w8a8/fp8/common.cu) for per-channel FP8,
``per_block_cast_to_fp8`` (vllm/utils/deep_gemm.py) for block FP8, ``get_nvfp4_global_scale`` /
``cvt_warp_fp16_to_fp4`` (tests/kernels/quantization/nvfp4_utils.py,
csrc/quantization/fp4/nvfp4_utils.cuh) and the test reference ``ref_nvfp4_quant`` / ``cast_to_fp4``
for NVFP4.
"""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels.quant import (
    FP8_BLOCK_MIN_AMAX,
    FP8_MAX,
    FP8_MIN_SCALE,
    _round_to_e2m1_codes,
    dequantize,
    quantize_fp8,
    quantize_nvfp4,
    to_e4m3,
    unpack_nvfp4_codes,
)
from zeromismatch.models.quantized import QUANT_FORMATS, quantize_weight


# ---- the float64 reference ---------------------------------------------------------------------
def _e4m3_grid() -> list[tuple[float, int]]:
    """(value, code) of every non-negative finite float8_e4m3fn: 4 exponent bits (bias 7), 3
    mantissa bits, exponent 0 subnormal, S.1111.111 the only NaN (so the top value is 448)."""
    out = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue
            value = m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
            out.append((value, e << 3 | m))
    return out


def _e2m1_grid() -> list[tuple[float, int]]:
    """(value, code) of every non-negative e2m1: 2 exponent bits (bias 1), 1 mantissa bit."""
    out = []
    for e in range(4):
        for m in range(2):
            out.append((m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1), e << 1 | m))
    return out


E4M3 = _e4m3_grid()
E2M1 = _e2m1_grid()


def _round(x: torch.Tensor, grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element of float64 ``x``: the nearest grid magnitude of |x| (a tie to the even code;
    past the top, the top) with x's sign, and its unsigned code. A plain nearest-value search."""
    values = torch.tensor([v for v, _ in grid], dtype=torch.float64)
    codes = torch.tensor([c for _, c in grid])
    distance = (x.abs().clamp(max=values[-1]).reshape(-1, 1) - values).abs()
    nearest = distance == distance.min(dim=1, keepdim=True).values
    even = nearest & (codes % 2 == 0)
    pick = torch.where(even.any(dim=1), even.int().argmax(dim=1), nearest.int().argmax(dim=1))
    return torch.copysign(values[pick], x.reshape(-1)).reshape(x.shape), codes[pick].reshape(x.shape)


def _near_midpoint(x: float, grid, ulps: float = 8) -> bool:
    magnitude = abs(x)
    return any(abs(magnitude - m) <= ulps * 2.0**-23 * max(magnitude, 2.0**-126) for m in _midpoints(grid))


def _ref_e4m3(x: torch.Tensor) -> torch.Tensor:
    return _round(x, E4M3)[0]


def _ref_e2m1_codes(x: torch.Tensor) -> list[int]:
    return (_round(x, E2M1)[1] | torch.signbit(x).long() << 3).tolist()


def _midpoints(grid) -> list[float]:
    values = [v for v, _ in grid]
    return [(a + b) / 2 for a, b in zip(values, values[1:])]


def test_reference_grids():
    assert len(E4M3) == 127 and E4M3[-1] == (448.0, 0x7E) and E4M3[1] == (2.0**-9, 1)
    assert [v for v, _ in E2M1] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    # the reference's own view of torch's encoding: every e4m3 bit pattern decodes to the grid
    decoded = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    assert decoded.tolist() == [v for v, _ in E4M3]


# ---- e4m3 rounding (every FP8 weight, the NVFP4 block scales) ----------------------------------
def _e4m3_inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    mids = torch.tensor(_midpoints(E4M3), dtype=torch.float64)  # 5 significant bits: exact in fp32
    random = torch.randn(2000, generator=gen, dtype=torch.float64) * 60
    tiny = torch.rand(300, generator=gen, dtype=torch.float64) * 2.0**-6  # the subnormal range
    saturating = torch.tensor([448.0, 449.0, 463.99, 464.0, 465.0, 1e4, 3e38])
    zeros = torch.tensor([0.0, -0.0, 2.0**-11, -(2.0**-11), 1e-40, -1e-40])  # the last two fp32-subnormal
    both = torch.cat([mids, random, tiny, saturating.double(), zeros.double()])
    return torch.cat([both, -both]).float()


def test_e4m3_matches_the_reference_bit_for_bit():
    x = _e4m3_inputs()
    got = to_e4m3(x)
    expected = _ref_e4m3(x.double())
    assert torch.equal(got.double(), expected)
    assert torch.equal(torch.signbit(got.float()), torch.signbit(expected))  # -0 stays -0


def test_e4m3_ties_go_to_the_even_code():
    mids = torch.tensor(_midpoints(E4M3), dtype=torch.float32)
    codes = to_e4m3(mids).view(torch.uint8)
    assert (codes % 2 == 0).all()
    assert to_e4m3(torch.tensor([2.0**-10, 3 * 2.0**-10, 464.0])).double().tolist() == [0.0, 2.0**-8, 448.0]


# ---- e2m1 rounding (NVFP4 elements) ------------------------------------------------------------
def _e2m1_inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    mids = torch.tensor(_midpoints(E2M1), dtype=torch.float64)
    random = torch.rand(2000, generator=gen, dtype=torch.float64) * 7
    subnormal = torch.tensor([0.5, 0.24, 0.2500001, 0.26, 0.1, 1e-40])  # 0.5 is e2m1's one subnormal
    saturating = torch.tensor([6.0, 6.5, 7.0, 100.0, 3e38])
    zeros = torch.tensor([0.0])
    both = torch.cat([mids, random, subnormal.double(), saturating.double(), zeros.double()])
    return torch.cat([both, -both]).float()


def test_e2m1_matches_the_reference_bit_for_bit():
    x = _e2m1_inputs()
    assert _round_to_e2m1_codes(x).tolist() == _ref_e2m1_codes(x.double())


def test_e2m1_ties_go_to_the_even_code_like_vllm_cast_to_fp4():
    # vLLM's reference cast_to_fp4 (tests/kernels/quantization): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
    # 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 -- hardware cvt.rn e2m1, round half to even
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    codes = _round_to_e2m1_codes(torch.cat([mids, -mids]))
    values = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert [values[c & 7] for c in codes[:7].tolist()] == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert codes[7:].tolist() == [c | 8 for c in codes[:7].tolist()]


# ---- FP8 end to end ------------------------------------------------------------------------------
def _check_codes_against_reference(scaled64: torch.Tensor, got: torch.Tensor, grid) -> None:
    """``got`` (float64 values) rounds ``scaled64``; near a midpoint either neighbour is accepted."""
    expected = _round(scaled64.flatten(), grid)[0]
    got = got.flatten()
    for i in torch.nonzero(got != expected).flatten().tolist():
        value = float(scaled64.flatten()[i])
        assert _near_midpoint(value, grid), (value, float(got[i]), float(expected[i]))
        assert (
            abs(abs(value) - abs(float(got[i])))
            <= abs(abs(value) - abs(float(expected[i]))) * (1 + 1e-6) + 1e-30
        )


def _weight(shape, seed, scale=0.05) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_fp8_per_channel_follows_vllm_per_token_quant():
    # dynamic_per_token_scaled_fp8_quant: scale = max(amax / 448, min_scaling_factor = 1/(448*512)),
    # value / scale (a division), saturated, cvt to e4m3
    w = _weight((24, 80), 0)
    w[3] = 0.0  # a zero row: the floor, not a division by zero
    w[5] *= 1e-3  # amax < 1/512: the floor again
    q = quantize_fp8(w)
    amax = w.double().abs().amax(dim=1, keepdim=True)
    expected_scales = torch.maximum(amax / 448, torch.tensor(1 / (448 * 512), dtype=torch.float64)).float()
    assert q.scales.shape == (24, 1) and q.block is None
    assert torch.equal(q.scales, expected_scales)
    assert q.scales[3, 0] == q.scales[5, 0] == torch.tensor(FP8_MIN_SCALE, dtype=torch.float32)
    _check_codes_against_reference(w.double() / q.scales.double(), q.data.double(), E4M3)
    assert (q.data[3].float() == 0).all()


def test_fp8_block_follows_vllm_per_block_cast():
    # per_block_cast_to_fp8: tile amax clamped to >= 1e-4, scale = amax / 448, value * (1 / scale)
    w = _weight((300, 200), 1)
    w[128:256, 128:] = 0.0  # an all-zero tile (rows 128-255, the ragged last column tile)
    q = quantize_weight(w, "fp8-block")
    assert q.block == (128, 128) and q.scales.shape == (3, 2) and q.format == "fp8"
    tiles = torch.zeros(384, 256, dtype=torch.float64)
    tiles[:300, :200] = w.double().abs()
    amax = tiles.view(3, 128, 2, 128).amax(dim=(1, 3)).clamp_min(float(torch.tensor(FP8_BLOCK_MIN_AMAX)))
    assert torch.equal(q.scales, (amax / 448).float())
    assert q.scales[1, 1] == torch.tensor(FP8_BLOCK_MIN_AMAX, dtype=torch.float32) / FP8_MAX
    expanded = q.scales.double().repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    _check_codes_against_reference(w.double() / expanded, q.data.double(), E4M3)


def test_fp8_exact_ties_round_to_even_through_quantize():
    # a row whose amax is 448 / 8: the scale is exactly 1/8, so w / scale is exact and every
    # e4m3 midpoint placed in the row (divided by 8) is a true tie
    mids = torch.tensor(_midpoints(E4M3)) / 8
    row = torch.cat([torch.tensor([56.0]), mids, -mids])
    for q in (quantize_fp8(row[None]), quantize_fp8(row[None], block=(1, 512))):
        assert float(q.scales.flatten()[0]) == 0.125
        assert torch.equal(q.data.double()[0], _ref_e4m3(row.double() * 8))
        assert (q.data.view(torch.uint8)[0, 1:] % 2 == 0).all()


@pytest.mark.parametrize("block", [None, (16, 32)])
def test_fp8_dequantize_error_bound(block):
    # 3 mantissa bits: a normal value errs by <= 2^-4 of itself; a subnormal one by <= half the
    # subnormal step (2^-10) times its scale; plus fp32 slop of the scaling and dequantization
    w = _weight((40, 70), 2, 3.0)
    w[0, :5] = torch.tensor([1e-30, -1e-30, 0.0, 1e-3, -1e-3])  # subnormal after scaling
    q = quantize_fp8(w, block=block)
    scales = (
        q.scales if block is None else q.scales.repeat_interleave(16, 0)[:40].repeat_interleave(32, 1)[:, :70]
    )
    err = (dequantize(q) - w).abs()
    assert (err <= w.abs() * 2**-4 + scales * 2**-10 + w.abs() * 2**-20).all()


# ---- NVFP4 end to end ----------------------------------------------------------------------------
def test_nvfp4_scales_follow_vllm():
    w = _weight((8, 64), 3)
    w[2, 16:32] = 0.0  # a zero block
    w[4, 32:48] *= 1e-6  # a block whose e4m3 scale underflows to zero
    q = quantize_nvfp4(w)
    amax = w.double().abs().max()
    # get_nvfp4_global_scale: g = 448 * 6 / amax (quantization multiplier); ours is its reciprocal
    s = float(q.global_scale)
    assert s == float((amax / 2688).float())
    assert abs(s * float(448 * 6 / amax) - 1) <= 2**-23
    # cvt_warp_fp16_to_fp4: SF = e4m3(g * (block amax / 6)), saturated at 448
    block_amax = w.double().abs().view(8, 4, 16).amax(-1)
    assert q.scales.shape == (8, 4) and q.scales.dtype == torch.float8_e4m3fn
    _check_codes_against_reference(block_amax / 6 / s, q.scales.double(), E4M3)
    assert q.scales[2, 1].float() == 0 and q.scales[4, 2].float() == 0
    # output scale 1 / (SF * s), 0 where SF is 0: those blocks are all +-0
    codes = unpack_nvfp4_codes(q.data)
    assert ((codes[2, 16:32] & 7) == 0).all() and ((codes[4, 32:48] & 7) == 0).all()
    assert (codes[4, 32:48] >> 3 == (w[4, 32:48] < 0).long()).all()
    # the elements: e2m1 of x / (SF * s), checked against the float64 reference
    denom = (q.scales.double() * s).repeat_interleave(16, 1)
    live = denom > 0
    scaled = torch.where(live, w.double() / torch.where(live, denom, 1.0), 0.0)
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    got = values[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    _check_codes_against_reference(scaled[live], got[live], E2M1)


def test_nvfp4_exact_ties_round_to_even_through_quantize():
    # global amax 2.625 = 2688 * 2^-10, so s = 2^-10; block 1's amax 1.5 gives SF = 1.5 / 6 / s = 256,
    # SF * s = 1/4: x * 4 is exact and x = midpoint / 4 is a true e2m1 tie
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) / 4
    block0 = torch.cat([torch.tensor([2.625]), torch.zeros(15)])
    block1 = torch.cat([torch.tensor([1.5]), mids, -mids, torch.tensor([-1.5])])
    q = quantize_nvfp4(torch.cat([block0, block1])[None])
    assert float(q.global_scale) == 2.0**-10 and float(q.scales[0, 1].float()) == 256.0
    codes = unpack_nvfp4_codes(q.data)[0, 16:].tolist()
    assert codes == _ref_e2m1_codes(block1.double() * 4)
    assert codes[1:8] == [0, 2, 2, 4, 4, 6, 6]  # 0, 1, 1, 2, 2, 4, 4


def test_nvfp4_all_zero_and_saturating_blocks():
    q = quantize_nvfp4(torch.zeros(2, 32))
    assert float(q.global_scale) == 1.0 and (q.scales.float() == 0).all() and (q.data == 0).all()
    assert torch.equal(dequantize(q), torch.zeros(2, 32))
    # the tensor's amax block maps to SF = 448 and its largest element to exactly 6 (code 7)
    w = _weight((4, 32), 4)
    q = quantize_nvfp4(w)
    row, col = divmod(int(w.abs().argmax()), 32)
    assert float(q.scales[row, col // 16].float()) == 448.0
    assert unpack_nvfp4_codes(q.data)[row, col] & 7 == 7


def test_nvfp4_dequantize_error_bound():
    # e2m1 rounding errs by <= a quarter of max(|x| / m, 1) block multipliers m = SF * s (half
    # the step in [0.5, 1) is 0.25, in [2^j, 2^(j+1)) it is 2^j / 4), saturation at 6 included
    w = _weight((16, 128), 5, 2.0)
    q = quantize_nvfp4(w)
    m = (q.scales.float() * q.global_scale).repeat_interleave(16, dim=1)
    err = (dequantize(q) - w).abs()
    assert (err <= 0.25 * torch.maximum(w.abs(), m) * (1 + 2**-20)).all()
    # vLLM's dequantize_nvfp4_to_dtype divides by g instead: the same values up to an ulp
    g = 448 * 6 / w.double().abs().max()
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    codes = unpack_nvfp4_codes(q.data)
    theirs = (
        values[codes & 7]
        * torch.where(codes >= 8, -1.0, 1.0)
        * q.scales.double().repeat_interleave(16, 1)
        / g
    )
    torch.testing.assert_close(dequantize(q).double(), theirs, rtol=2**-22, atol=0)


# ---- the formats as the model names them ---------------------------------------------------------
def test_format_names_and_scale_shapes():
    assert QUANT_FORMATS == ("fp8", "fp8-block", "nvfp4")
    w = _weight((300, 256), 6)
    per_channel = quantize_weight(w, "fp8")
    block = quantize_weight(w, "fp8-block")
    nvfp4 = quantize_weight(w, "nvfp4")
    assert per_channel.format == "fp8" and per_channel.block is None and per_channel.scales.shape == (300, 1)
    assert block.format == "fp8" and block.block == (128, 128) and block.scales.shape == (3, 2)
    assert nvfp4.format == "nvfp4" and nvfp4.scales.shape == (300, 16) and nvfp4.data.shape == (300, 128)
    # per channel tracks each row's range, so it errs less than one scale per 128 x 128 tile here
    w[0] *= 50
    assert (dequantize(quantize_weight(w, "fp8")) - w)[1:].abs().max() < (
        dequantize(quantize_weight(w, "fp8-block")) - w
    )[1:].abs().max()
    with pytest.raises(ValueError, match=r"layer\.x: nvfp4 needs in_features divisible by 16"):
        quantize_weight(torch.zeros(4, 40), "nvfp4", "layer.x")
    with pytest.raises(ValueError, match="unknown quantization format 'fp4'"):
        quantize_weight(w, "fp4")
