"""FP8 (e4m3) and NVFP4 weight quantization shared by both kernel sets, and the FP8 KV cache's
rounding (``fp8_kv_roundtrip``, the engine's ``kv_cache_dtype="fp8_e4m3"``).

The rules are vLLM's (function names below, in vllm-project/vllm); the arithmetic is correctly
rounded fp32 where vLLM's CUDA kernels use approximate reciprocals (``rcp.approx.ftz``), so a value
within an ulp of a rounding boundary can land on the other side than on a GPU. Every conversion to
e4m3 or e2m1 is round-to-nearest, ties to even, saturating (PTX ``cvt.rn.satfinite``): e4m3 by
``to_e4m3`` (torch's cast after a clamp to +-448), e2m1 by ``_round_to_e2m1_codes``.

FP8 e4m3 (``torch.float8_e4m3fn``, max 448); ``scales`` are dequantization multipliers, as vLLM
stores them (``w ~= float(data) * scale``):
    per channel (``block=None``): ``scale[n] = max(amax|w[n, :]| / 448, 1 / (448 * 512))``,
    ``data = e4m3(w / scale)`` -- ``scaled_fp8_quant(w, use_per_token_if_dynamic=True)``
    (``dynamic_per_token_scaled_fp8_quant``), which vLLM's tests use to make per-channel weights;
    the floor (``min_scaling_factor``) only acts on rows with amax < 1/512.
    block (bo, bi): ``scales [ceil(N/bo), ceil(K/bi)]``, ``scale = max(amax(tile), 1e-4) / 448``,
    ``data = e4m3(w * (1 / scale))`` -- ``per_block_cast_to_fp8`` (vllm/utils/deep_gemm.py, from
    DeepGEMM: DeepSeek-V3's 128x128 weight blocks); ragged edge tiles take the amax of what they hold.
NVFP4 (the OCP/NVIDIA layout): e2m1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
    negatives; bit 3 = sign, bits 0-2 = index into that list), two per byte with the even element
    in the low nibble; one ``float8_e4m3fn`` scale per 16 consecutive input-dim elements; one fp32
    ``global_scale`` per tensor. vLLM (``get_nvfp4_global_scale``, ``scaled_fp4_quant`` /
    ``cvt_warp_fp16_to_fp4``, reference ``ref_nvfp4_quant``) takes the *quantization* multiplier
    ``g = 448 * 6 / amax|w|``; here ``global_scale`` is its reciprocal, the *dequantization*
    multiplier ``s = amax|w| / (448 * 6)`` (the convention of ModelOpt checkpoints'
    ``weight_scale_2``), so ``w ~= e2m1 * float(block_scale) * global_scale``. With it:
    ``block_scale = e4m3(min((amax(block) / 6) / s, 448))`` (vLLM: ``g * (amax / 6)``), the
    elements ``e2m1(x * (1 / (float(block_scale) * s)))``, and a block whose scale rounds to zero
    gets +-0 codes (vLLM: output scale 0). An all-zero tensor gets ``s = 1`` (vLLM's
    ``g`` would be infinite). e2m1 ties go to the even code: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
    -> 0, 1, 1, 2, 2, 4, 4 (vLLM's ``cast_to_fp4``); the sign bit is kept, so small negatives
    become -0.
Non-finite weights raise ValueError (one inf would poison a row's, a tile's or the global scale).

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
#: vLLM's per-token/per-channel scale floor (``min_scaling_factor``): ``1 / (448 * 512)``
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
#: ``per_block_cast_to_fp8``'s floor on a tile's amax (an all-zero tile still gets a finite scale)
FP8_BLOCK_MIN_AMAX = 1e-4
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_TINY = 1e-12


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` -> ``float8_e4m3fn``, nearest value, ties to even, saturated to +-448. The clamp
    makes the cast saturating (cvt.rn.satfinite) whatever torch build: some overflow to NaN."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


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
    """FP8 e4m3 weight with per-output-channel scales (block=None) or block scales (module
    docstring: vLLM's ``scaled_fp8_quant`` per token, resp. ``per_block_cast_to_fp8``)."""
    _check_weight(weight)
    w = weight.detach().float()
    _check_finite(w)
    n, k = w.shape
    if block is None:
        scales = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(FP8_MIN_SCALE)
        scaled = w / scales  # the per-token kernel divides
    else:
        bo, bi = block
        if bo <= 0 or bi <= 0:
            raise ValueError(f"block sizes must be positive, got {block}")
        nb_o, nb_i = math.ceil(n / bo), math.ceil(k / bi)
        padded = w.new_zeros(nb_o * bo, nb_i * bi)
        padded[:n, :k] = w.abs()
        amax = padded.view(nb_o, bo, nb_i, bi).amax(dim=(1, 3))
        scales = amax.clamp_min(FP8_BLOCK_MIN_AMAX) / FP8_MAX
        scaled = w * _expand_block_scales(1.0 / scales, (bo, bi), (n, k))  # the block cast multiplies
    data = to_e4m3(scaled)
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
    # the dequantization multiplier (module docstring); an all-zero tensor has no amax to scale by
    global_scale = w.abs().amax() / (FP8_MAX * E2M1_MAX)
    global_scale = torch.where(global_scale > 0, global_scale, torch.ones_like(global_scale)).reshape(())
    blocks = w.view(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = blocks.abs().amax(dim=-1)
    block_scales = to_e4m3((block_amax / E2M1_MAX) / global_scale)
    denom = block_scales.float() * global_scale
    # vLLM's output scale: the reciprocal of the block's dequantization multiplier, 0 for a zero scale
    inverse = torch.where(denom > 0, 1.0 / denom, torch.zeros_like(denom))
    codes = _round_to_e2m1_codes((blocks * inverse.unsqueeze(-1)).reshape(n, k))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return QuantizedWeight("nvfp4", packed, block_scales, (n, k), global_scale=global_scale)


def _round_to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes of fp32 ``x`` as ``cvt.rn.satfinite.e2m1x2.f32`` converts: the nearest e2m1
    magnitude, a tie (an exact midpoint) to the even code, magnitudes past 6 saturated to 6, the
    sign bit kept (a negative that rounds to zero is -0, code 8)."""
    mags = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    midpoints = (mags[1:] + mags[:-1]) / 2  # 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5: exact in fp32
    magnitude = x.abs().clamp(max=E2M1_MAX)
    lower = torch.bucketize(magnitude, midpoints)  # a midpoint counts to the lower neighbour ...
    upper = torch.bucketize(magnitude, midpoints, right=True)  # ... or to the upper; else they agree
    index = torch.where(lower % 2 == 0, lower, upper)  # on a tie one of the two codes is even
    sign = torch.signbit(x).to(torch.int64) << 3
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
    from .weight_cache import cached_from_weights

    tensors: tuple[torch.Tensor, ...] = (qweight.data, qweight.scales)
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
    # vLLM's per-tensor kernels multiply by the inverted scale (scaled_fp8_conversion<true>)
    codes = to_e4m3(x2d.float() * (1.0 / scale))
    return codes, scale


def fake_quantize_activations_nvfp4(x2d: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize of activations with one global scale for the whole batch."""
    _check_weight(x2d)
    return dequantize(_quantize_nvfp4(x2d.detach().float()), x2d.dtype)


# ---- FP8 KV cache (the engine's kv_cache_dtype) -------------------------------------
#: the engine's ``kv_cache_dtype`` values, as vLLM spells them
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
#: the activation dtypes an FP8 KV cache serves: vLLM's FP8-KV attention backends take fp16/bf16
#: queries (FlashAttention's ``supported_dtypes``), and every e4m3 value times a unit scale is exact
#: in both, which the emulated cache relies on
FP8_KV_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


def check_kv_cache_dtype(kv_cache_dtype, model_dtype: torch.dtype | None = None) -> None:
    """One ValueError for a ``kv_cache_dtype`` the engine cannot serve: a value outside
    ``KV_CACHE_DTYPES``, or ``"fp8_e4m3"`` for a model whose activation dtype (``model_dtype``,
    when given) is not bfloat16 or float16."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    fp8 = kv_cache_dtype == "fp8_e4m3"
    if fp8 and model_dtype is not None and model_dtype not in FP8_KV_ACTIVATION_DTYPES:
        raise ValueError(
            f"kv_cache_dtype='fp8_e4m3' needs a bfloat16 or float16 model, got {model_dtype}: vLLM's FP8 "
            "KV cache attention backends take fp16/bf16 queries"
        )


def fp8_kv_roundtrip(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """What an attention kernel reads back, in ``x``'s dtype, from an FP8 (e4m3) KV cache ``x``
    was written to with ``scale``.

    The write is vLLM's ``reshape_and_cache`` / ``reshape_and_cache_flash`` with
    ``kv_cache_dtype="fp8_e4m3"`` (``fp8::scaled_convert``, nvidia ``scaled_vec_conversion``): the
    value in fp32 divided by the scale, saturated to +-448 and rounded to the nearest e4m3 value,
    ties to even (``__nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...)``; ``to_e4m3``). The read is the
    kernel's dequantization: the e4m3 value in fp32 times the scale, rounded to the activation dtype.
    With the engine's unit scale the division and the multiplication are exact on any path (a GPU's
    approximate reciprocal included).
    Elementwise, so a token's K/V get the same bits in any batch.

    The engine's cache is *emulated*: its tensors stay in the activation dtype and hold these
    dequantized values, which are bit for bit what a real e4m3 cache dequantizes to (with the unit
    scale every e4m3 value is exact in bf16 and fp16). The memory an FP8 cache saves is not
    modelled. Only K and V are rounded: FlashAttention 3's FP8 path in vLLM also quantizes the
    queries, which this does not model (the backends that dequantize K/V in the kernel do not)."""
    return (to_e4m3(x.float() / scale).float() * scale).to(x.dtype)


__all__ = [
    "FP8_BLOCK_MIN_AMAX",
    "FP8_KV_ACTIVATION_DTYPES",
    "FP8_MAX",
    "FP8_MIN_SCALE",
    "KV_CACHE_DTYPES",
    "NVFP4_BLOCK",
    "QuantizedWeight",
    "cached_dequantize",
    "check_kv_cache_dtype",
    "dequantize",
    "fake_quantize_activations_nvfp4",
    "fp8_kv_roundtrip",
    "fp8_tensor_scale",
    "quantize_activations_fp8_per_tensor",
    "quantize_fp8",
    "quantize_nvfp4",
    "to_e4m3",
    "unpack_nvfp4_codes",
]
