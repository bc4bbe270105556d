"""Default dense ops: the fastest stock torch path, as an unaligned stack runs it.

GEMMs at whatever M arrives, on whichever stock library is faster on this CPU: oneDNN
with the weight prepacked once (as torch's CPU compiler and vLLM's CPU backend run
linears; the packed copy is cached while the weight is unchanged, see
``aligned/gemm.py``), except fp32 shapes where MKL's ``F.linear`` measured faster
(``_mkl_is_faster``); ``F.linear`` under autograd. A row-parallel linear is a local GEMM
plus ``all_reduce(SUM)``; RMSNorm as torch's fused ``F.rms_norm``; torch's fused ``silu`` (product
taken in place); an lm_head in the activation dtype, upcast afterwards; quantized linears
as W8A8 / W4A4 with one activation scale for the whole batch. ``processed_log_softmax`` is
the shared sampler definition from the aligned module: the distribution is a definition,
not a kernel choice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..aligned.dense import processed_log_softmax  # noqa: F401  (re-exported: one shared definition)
from ..aligned.gemm import onednn_linear, uses_onednn
from ..base import QuantizedWeight
from ..quant import cached_dequantize, fake_quantize_activations_nvfp4, quantize_activations_fp8_per_tensor


def _mkl_is_faster(m: int, k: int, n: int) -> bool:
    """fp32 shapes where MKL sgemm beat prepacked oneDNN (1 thread, this CPU): a single row
    (gemv) on small weights (K*N <= 2^19: 6 vs 17 us at 256^2) and on huge ones (K*N >= 2^23,
    memory-bound: 8.4 vs 9.1 ms at 1024x32000); and tiny weights (K*N <= 2^16) up to 63 rows,
    where oneDNN's ~12 us fixed cost per call dominates. Elsewhere oneDNN was faster (e.g.
    M=4, 1024^2: 97 vs 292 us; M=512: 10.0 vs 12.4 ms)."""
    size = k * n
    if m == 1:
        return size <= 2**19 or size >= 2**23
    return size <= 2**16 and m < 64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    if (
        m == 0
        or weight.dim() != 2
        or x.dtype != weight.dtype
        or not uses_onednn(x.dtype, x.device)
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        or (x.dtype == torch.float32 and _mkl_is_faster(m, k, weight.shape[0]))
    ):
        return F.linear(x, weight, bias)
    out = onednn_linear(x.reshape(m, k), weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def row_parallel_linear(
    x_local: torch.Tensor,
    weight_local: torch.Tensor,
    bias: torch.Tensor | None = None,
    group=None,
    virtual_shards: int = 4,
) -> torch.Tensor:
    return local_gemm_then_all_reduce(linear, x_local, weight_local, bias, group)


def local_gemm_then_all_reduce(gemm, x_local, weight_local, bias, group) -> torch.Tensor:
    """The unaligned row-parallel linear with ``gemm`` as the local product: each rank's partial
    sum, ``all_reduce(SUM)`` in whatever order the backend reduces, then the bias."""
    out = gemm(x_local, weight_local)
    if group is not None:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    if bias is not None:
        out = out + bias
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if weight.dtype == x.dtype:  # torch's fused norm (measured 10-30% faster than the HF form)
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    hidden = x.float() * F.silu(gate.float())
    grouped = hidden.reshape(*hidden.shape[:-1], -1, group_size)
    normed = F.rms_norm(grouped, grouped.shape[-1:], None, eps).reshape(hidden.shape)
    return weight * normed.to(x.dtype)


def rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    # HF style: cos/sin in fp32, cast to the activation dtype, rotation in that dtype
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    cos = torch.cos(angles).to(x.dtype)[:, None, :]
    sin = torch.sin(angles).to(x.dtype)[:, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return F.silu(gate) * up
    return F.silu(gate).mul_(up)  # in place: one allocation fewer, same bits


def relu2(x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.square(F.relu(x))
    return F.relu(x).square_()  # in place: one allocation fewer, same bits


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h2d = hidden.reshape(-1, hidden.shape[-1])
    return linear(h2d, weight.to(h2d.dtype)).float()


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def quant_linear(x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 / W4A4 numerics with one activation scale for the whole batch (what fast paths do):
    activations are quantized and dequantized with a per-tensor scale, the weight is the
    cached dequantized weight, the GEMM is the default ``linear``. (``torch._scaled_mm`` computes the same
    W8A8 product natively but measured 13-40 ms per 1024x1024 call on this CPU, 10-100x slower
    than this, so it is not the fastest stock path here.)"""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
    x2d = x.reshape(-1, x.shape[-1])
    if qweight.format == "fp8":
        codes, scale = quantize_activations_fp8_per_tensor(x2d)
        x_q = (codes.float() * scale).to(x.dtype)
    else:
        x_q = fake_quantize_activations_nvfp4(x2d)
    out = linear(x_q, cached_dequantize(qweight, x.dtype), bias)
    return out.reshape(*x.shape[:-1], qweight.shape[0])
