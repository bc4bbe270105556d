"""The fast-native kernel set: the unaligned throughput baseline of equal effort.

Every cost-of-alignment ratio divides by this set (issue 33), so it has the engine features the
aligned-native set has -- every op of a decode step is capturable, so step graphs replay it --
and takes, op by op, the fastest path this project has on this CPU, free to be batch-variant
where that is faster. Measured: at the tiny presets' decode shapes the fastest capturable code
is the fixed-order native C, so this set is mostly those kernels; it differs from aligned-native
by its bf16 head, its prefill GEMM choice and its stock ops under autograd:

- GEMMs (``linear``, ``quant_linear``, ``lm_head``, ``row_parallel_linear``): at each call the
  faster of MKL's ``F.linear`` and the native panel GEMM for that (M, K, N, dtype), by a static
  rule measured on this machine (``_mkl_is_faster``). The choice follows M, the batch's token
  count, as cuBLAS heuristics do; nothing promises a row's bits across batches (at the bf16
  shapes measured MKL's result happened to have the panel GEMM's bits: both accumulate in fp32
  and round once). oneDNN's
  prepacked GEMM is not used: it was slower than the panel GEMM at every shape measured, and
  its opaque weight cannot be replayed by a step graph. The lm_head runs in the activation
  dtype (a bf16 head in bf16), upcast afterwards. Quantized weights are weight-only
  (dequantized once, cached): there is no FP8 GEMM on this CPU, so W8A8's activation rounding
  would only add work (the ``default`` set keeps the W8A8 numerics the fast stacks' *numerics*
  follow).
- attention, paged attention, the Mamba2 scan and conv, the MoE experts, norms, rope and the
  SwiGLU product: the native C kernels without autograd (the fastest capturable code here, and
  free of host reads); with autograd the stock torch ops of the ``default`` set (SDPA, chunked
  SSD, ``F.rms_norm``), whose backward is torch's own.
- routing: the native route without autograd (the stock torch route's ~10 small ops made MoE
  decode 1.19x slower), the stock one with it; ``relu2``, log-softmax: the stock torch ops.

What a performance-minded engineer would still do that this set does not: split-K GEMMs and a
split-KV decode attention sized by the batch when threads outnumber output tiles (batch 1 at 2+
threads), a grouped GEMM over all experts, fused norm+GEMM and rope+attention, and per-machine
autotuning of the GEMM choice instead of one static rule.

    python benchmarks/rollout.py --model tiny-qwen3 --no-hf
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from ._modules import kernel_set_from_modules
from .base import QuantizedWeight
from .default import dense as stock
from .default import sequence as stock_sequence
from .native import attention as native_attention
from .native import conv as native_conv
from .native import experts as native_experts
from .native import gemm as native_gemm
from .native import pointwise as native_pointwise
from .native import route as native_route
from .native import ssm as native_ssm
from .native import swiglu as native_swiglu
from .quant import cached_dequantize


def _grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _mkl_is_faster(m: int, k: int, n: int, dtype: torch.dtype) -> bool:
    """Shapes where MKL's ``F.linear`` beat the native panel GEMM in the engine: bf16 at 512+ rows
    with K <= 128 and N >= 512 (324 vs 376 us at 512 x 128 x 512, 1 thread, AMD EPYC; eager
    prefill only). fp32 one-row GEMMs on small weights were faster on MKL called from Python (6.6
    vs 9.1 us at 1 x 128 x 256) but not in a replayed decode step, where the native call skips its
    Python checks and MKL still pays torch's dispatch: with MKL there, batch-1 decode ran at 0.74x
    the panel GEMM's tokens/s, so that rule was dropped. Other dtypes (the panel GEMM computes fp32
    and bf16 only) take ``F.linear``."""
    if dtype is torch.bfloat16:
        return m >= 512 and k <= 128 and n >= 512
    return dtype is not torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if _grad(x, weight, bias) or weight.dim() != 2 or x.dtype is not weight.dtype:
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    if m == 0 or _mkl_is_faster(m, k, weight.shape[0], x.dtype):
        return F.linear(x, weight, bias)
    return native_gemm.linear(x, weight, bias)


def quant_linear(x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
    n, k = qweight.shape
    m = x.numel() // k if k else 0
    if _grad(x, bias) or m == 0 or _mkl_is_faster(m, k, n, x.dtype):
        return F.linear(x, cached_dequantize(qweight, x.dtype), bias)
    return native_gemm.quant_linear(x, qweight, bias)


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h2d = hidden.reshape(-1, hidden.shape[-1])
    return linear(h2d, weight.to(h2d.dtype)).float()


def row_parallel_linear(x_local, weight_local, bias=None, group=None, virtual_shards: int = 4):
    return stock.local_gemm_then_all_reduce(linear, x_local, weight_local, bias, group)


def _native_unless_grad(name: str, native_module):
    """The native op without autograd, the stock one with it (module docstring)."""
    native_op = getattr(native_module, name)
    stock_op = getattr(stock, name, None) or getattr(stock_sequence, name)

    def op(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return (stock_op if _grad(*tensors) else native_op)(*args, **kwargs)

    op.__name__ = name
    op.__doc__ = f"native ``{name}`` without autograd, the default set's with it"
    return op


attention = _native_unless_grad("attention", native_attention)
paged_attention = _native_unless_grad("paged_attention", native_attention)
ssm_scan = _native_unless_grad("ssm_scan", native_ssm)
causal_conv1d = _native_unless_grad("causal_conv1d", native_conv)
moe_experts = _native_unless_grad("moe_experts", native_experts)
rms_norm = _native_unless_grad("rms_norm", native_pointwise)
gated_rms_norm = _native_unless_grad("gated_rms_norm", native_pointwise)
rope = _native_unless_grad("rope", native_pointwise)
silu_mul = _native_unless_grad("silu_mul", native_swiglu)
moe_route = _native_unless_grad("moe_route", native_route)
relu2 = stock.relu2
log_softmax = stock.log_softmax
processed_log_softmax = stock.processed_log_softmax

FastNativeKernels = kernel_set_from_modules(
    "FastNativeKernels", "fast-native", [sys.modules[__name__]], __doc__.splitlines()[0]
)
