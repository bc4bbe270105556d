"""FP8 (e4m3) and NVFP4 weight quantization shared by both kernel sets.

FP8 e4m3 (``torch.float8_e4m3fn``, max 448):
    per-channel: ``scale[n] = amax(|w[n, :]|) / 448``; block (bo, bi): one scale per
    ``bo x bi`` tile, ``scales [ceil(N/bo), ceil(K/bi)]``. ``data = fp8(w / scale)``
    (round-to-nearest-even by torch's cast, saturated to +-448 first).
NVFP4 (the OCP/NVIDIA layout): e2m1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
    their negatives; bit 3 = sign, bits 0-2 = index into that list), two per byte with
    the even element in the low nibble; one ``float8_e4m3fn`` scale per 16 consecutive
    input-dim elements; one fp32 ``global_scale`` per tensor. Here ``global_scale`` is the
    *dequantization* multiplier: ``w ~= e2m1 * float(block_scale) * global_scale`` with
    ``global_scale = amax(|w|) / (448 * 6)`` so block scales use e4m3's full range.
    Magnitudes are rounded to the nearest e2m1 value; a tie goes to the *smaller* one
    (``torch.bucketize`` on the midpoints), unlike hardware ``cvt.rn`` e2m1, which rounds
    to nearest even: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 -> here 0, 0.5, 1, 1.5, 2, 3, 4,
    round-to-nearest-even 0, 1, 1, 2, 2, 4, 4. Kept because changing it would change the
    bits of committed quantized runs (docs/parity.md, precision notes).
    Non-finite weights raise ValueError (one inf would poison a row's or the global scale).

Dequantization is elementwise and deterministic, so engine and trainer running the same
``dequantize`` on the same ``QuantizedWeight`` get the same bits. Activation quantization
(``fake_quantize_activations_*``) exists for the *default* set's W8A8 / W4A4 paths, whose
scale spans the whole batch: that is the drift the aligned set refuses.
"""

from __future__ import annotations

import math

import torch

from .base import QuantizedWeight

FP8_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_TINY = 1e-12


def _e2m1_table(device: torch.device) -> torch.Tensor:
    mags = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])  # code 8..15 = negative


def _check_weight(weight: torch.Tensor) -> None:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        got = getattr(weight, "shape", type(weight))
        raise ValueError(f"weight must be a 2-D tensor [out, in], got {got}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be floating point, got {weight.dtype}")


def _check_finite(w: torch.Tensor) -> None:
    # one inf or nan would poison its scale (fp8: the row; nvfp4: every block via the global scale)
    if not bool(torch.isfinite(w).all()):
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"weight has {bad} non-finite (inf/nan) values; cannot quantize it")


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int] | None = None) -> QuantizedWeight:
    """FP8 e4m3 weight with per-output-channel scales (block=None) or block scales."""
    _check_weight(weight)
    w = weight.detach().float()
    _check_finite(w)
    n, k = w.shape
    if block is None:
        scales = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(_TINY)
        expanded = scales
    else:
        bo, bi = block
        if bo <= 0 or bi <= 0:
            raise ValueError(f"block sizes must be positive, got {block}")
        nb_o, nb_i = math.ceil(n / bo), math.ceil(k / bi)
        padded = w.new_zeros(nb_o * bo, nb_i * bi)
        padded[:n, :k] = w.abs()
        amax = padded.view(nb_o, bo, nb_i, bi).amax(dim=(1, 3))
        scales = (amax / FP8_MAX).clamp_min(_TINY)
        expanded = _expand_block_scales(scales, (bo, bi), (n, k))
    data = (w / expanded).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantizedWeight("fp8", data, scales, (n, k), block=block)


def _expand_block_scales(
    scales: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]
) -> torch.Tensor:
    bo, bi = block
    n, k = shape
    return scales.repeat_interleave(bo, dim=0)[:n].repeat_interleave(bi, dim=1)[:, :k]


def quantize_nvfp4(weight: torch.Tensor) -> QuantizedWeight:
    """NVFP4: e2m1 codes packed two per byte, e4m3 scale per 16 elements, fp32 global scale."""
    _check_weight(weight)
    w = weight.detach().float()
    _check_finite(w)
    return _quantize_nvfp4(w)


def _quantize_nvfp4(w: torch.Tensor) -> QuantizedWeight:
    """``quantize_nvfp4`` of a detached fp32 ``w`` without the finiteness check (activations:
    a non-finite activation propagates as in any other op)."""
    n, k = w.shape
    if k % NVFP4_BLOCK != 0:
        raise ValueError(f"nvfp4 needs the input dim to be a multiple of {NVFP4_BLOCK}, got {k}")
    global_scale = (w.abs().amax() / (FP8_MAX * E2M1_MAX)).clamp_min(_TINY).reshape(())
    blocks = w.view(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(dim=-1)
    block_scales = (block_amax / (E2M1_MAX * global_scale)).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = block_scales.float() * global_scale
    scaled = blocks / torch.where(denom > 0, denom, torch.ones_like(denom)).unsqueeze(-1)
    codes = _round_to_e2m1_codes(scaled.reshape(n, k))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return QuantizedWeight("nvfp4", packed, block_scales, (n, k), global_scale=global_scale)


def _round_to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    mags = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    midpoints = (mags[1:] + mags[:-1]) / 2
    index = torch.bucketize(x.abs().clamp(max=E2M1_MAX), midpoints)  # a midpoint goes to the lower value
    sign = (x < 0).to(torch.int64) << 3
    return (index | sign).to(torch.uint8)


def unpack_nvfp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K/2]`` -> int64 codes ``[N, K]`` (low nibble = even element)."""
    low = (packed & 0x0F).to(torch.int64)
    high = (packed >> 4).to(torch.int64)
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


def dequantize(qweight: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight the GEMM sees: computed in fp32, rounded once to ``dtype``."""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"expected a QuantizedWeight, got {type(qweight).__name__}")
    n, k = qweight.shape
    if qweight.format == "fp8":
        if qweight.block is None:
            scales = qweight.scales.float().reshape(n, 1)
        else:
            scales = _expand_block_scales(qweight.scales.float(), qweight.block, (n, k))
        return (qweight.data.float() * scales).to(dtype)
    if qweight.format == "nvfp4":
        if qweight.global_scale is None:
            raise ValueError("nvfp4 QuantizedWeight needs a global_scale")
        values = _e2m1_table(qweight.data.device)[unpack_nvfp4_codes(qweight.data)]
        scale = qweight.scales.float().repeat_interleave(NVFP4_BLOCK, dim=1) * qweight.global_scale.float()
        return (values * scale).to(dtype)
    raise ValueError(f"unknown quantization format {qweight.format!r}; expected 'fp8' or 'nvfp4'")


def cached_dequantize(qweight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """``dequantize`` memoised in gemm.py's weight cache (``cached_from_weights``): keyed on every
    tensor of the QuantizedWeight (data, scales and global_scale when present) with their in-place
    versions, held by weak references, least recently used first out of a byte budget; both kernel
    sets use it so neither pays a dequantization per call that the other skips. Same bits as
    ``dequantize``. Not cached (dequantized every call): inference tensors (no version counter)
    and anything the cache refuses (see gemm.py's module docstring)."""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"expected a QuantizedWeight, got {type(qweight).__name__}")
    # gemm.py lives in the aligned package, whose dense.py imports this module
    from .aligned.gemm import cached_from_weights

    tensors = (qweight.data, qweight.scales)
    if qweight.global_scale is not None:
        tensors += (qweight.global_scale,)
    tag = ("dequantize", qweight.format, tuple(qweight.shape), qweight.block, dtype)

    def build():
        value = dequantize(qweight, dtype)
        return value, value.numel() * value.element_size()

    value = cached_from_weights(tensors, tag, build)
    return dequantize(qweight, dtype) if value is None else value


# ---- activation quantization (the default set's batch-wide scales) ------------------
def fp8_tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """One e4m3 scale for the whole tensor: ``amax(|x|) / 448`` (spans every row of the batch)."""
    return (x.detach().abs().amax().float() / FP8_MAX).clamp_min(_TINY)


def quantize_activations_fp8_per_tensor(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 codes of ``x2d`` and the batch-wide scale (W8A8 'static/dynamic per-tensor')."""
    scale = fp8_tensor_scale(x2d)
    codes = (x2d.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def fake_quantize_activations_nvfp4(x2d: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize of activations with one global scale for the whole batch."""
    _check_weight(x2d)
    return dequantize(_quantize_nvfp4(x2d.detach().float()), x2d.dtype)


__all__ = [
    "FP8_MAX",
    "NVFP4_BLOCK",
    "QuantizedWeight",
    "cached_dequantize",
    "dequantize",
    "fake_quantize_activations_nvfp4",
    "fp8_tensor_scale",
    "quantize_activations_fp8_per_tensor",
    "quantize_fp8",
    "quantize_nvfp4",
    "unpack_nvfp4_codes",
]
