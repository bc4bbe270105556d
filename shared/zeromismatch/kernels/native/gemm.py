"""Native fixed-order GEMMs (gemm.c): the aligned-native linear, quant_linear, lm_head, row-parallel.

Why. The aligned linear pays a oneDNN call's fixed cost plus row padding (0.22-0.86x of the default
at one row). The aligned set's fp32 lm_head (PipelineRL's fix: logits in fp32, not rounded to bf16)
upcasts a bf16 head and runs an fp32 GEMM: about half the default set's speed, whose bf16 GEMM
uses the AVX512-BF16 dot instructions (measured 0.30-0.54x, issue 3). And its row-parallel
linear makes one oneDNN call per virtual shard plus a tree (0.14-0.91x). torch on the CPU has no
bf16 GEMM with fp32 output that keeps up (MKL's ``cblas_gemm_bf16bf16f32`` measured 0.07-0.30x
here), so ``gemm.c`` is one.

What. ``gemm.c`` multiplies x by a weight packed into panels of 16 output columns and keeps one
accumulator per output, updated in ascending k (fp32: fused multiply-add; bf16: the bf16 pair
products as one vdpbf16ps lane adds them, each step rounded once and flushed below FLT_MIN; bf16
products lose nothing outside underflow, so the logits have fp32 precision like the upcast GEMM's,
in a different order; gemm.c states the rule exactly). Every output's bits are
fixed by that rule whatever the batch, the row's position, the thread count or the register
block, and an ``-O0`` build (portable C) gives the bits of the ``-march=native`` build, AVX-512 or
AVX2 + FMA (tests). Without either the portable path is one FMA chain per output: on an AVX2-only
EPYC it ran at 1.5 GFLOP/s, the AVX2 path at 39-71 (fp32, 8-512 rows, K 1024, 1 thread; MKL 21-70),
bf16 at 7-12 (MKL 9-10). The packed
weight is cached while the weight is unchanged (``kernels/weight_cache.py``).

- ``linear(x, weight, bias)``: the rule on x's dtype (fp32, or bf16 with fp32 sums; fp16 upcast
  exactly to fp32; fp64 keeps the aligned op), rounded to x's dtype, plus the bias; the aligned
  linear's column-parallel property holds by construction (an output column's bits do not depend
  on the other columns).
- ``quant_linear``: the aligned set's dequantization (weight-only, cached), then ``linear``.
- ``lm_head(hidden, weight)``: bf16 hidden and weight (and an even K) run the bf16 rule; any
  other dtypes are upcast to fp32 first, as the aligned lm_head does, and run the fp32 rule.
- ``row_parallel_linear``: the virtual-shard partials (``collectives.virtual_shard_reduce``)
  come from one call; partial p is the rule over piece p's k, rounded to x's dtype (as the
  aligned set's partials are), then the same fixed fp32 tree.

The backward is the plain gradient of the product (``_NativeMatmul``; at TP > 1 the pure-torch
aligned pieces' gradient, ``_autograd.py``, through ``collectives.all_gather_stacked``'s
gradient); no double backward. Bits differ from the pure-torch
aligned set's, so engine and trainer must both run aligned-native. CPU only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import collectives
from ..aligned import dense as aligned_dense
from ..aligned.gemm import row_invariant_pieces
from ..base import QuantizedWeight
from ..quant import cached_dequantize, dequantize
from ..weight_cache import cached_from_weight, cached_from_weights
from . import _build
from ._autograd import native_with_reference_backward, refuse_double_backward
from ._device import CPU, require_cpu

#: output columns per panel and panels per register block (must match gemm.c)
PANEL = 16
PANELS_PER_BLOCK = 4
_BLOCK_COLS = PANEL * PANELS_PER_BLOCK
#: dtypes linear and row_parallel_linear compute natively (exactly upcast to fp32 or bf16 pairs); others
#: (fp64) keep the aligned op, whose precision the fp32 rule would lower
_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _pack(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``weight [N, K]`` as panels: fp32 ``[P, K, 16]``, bf16 ``[P, K/2, 16, 2]``; N is padded with
    zero rows up to a whole register block (padding columns are computed, never returned)."""
    n, k = weight.shape
    panels = -(-n // _BLOCK_COLS) * PANELS_PER_BLOCK
    padded = weight.new_zeros(panels * PANEL, k)
    padded[:n] = weight
    if weight.dtype == torch.bfloat16:
        packed = padded.view(panels, PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    else:
        packed = padded.view(panels, PANEL, k).permute(0, 2, 1).contiguous()
    return packed, packed.numel() * packed.element_size()


def _packed(weight: torch.Tensor, dtype: torch.dtype, cache: bool = True) -> torch.Tensor:
    """``weight`` cast to ``dtype`` and packed, from the packed-weight cache (keyed by the weight
    itself, so a bf16 head used with the fp32 rule is cast once, not per call), or packed afresh
    where that cache refuses (see aligned/gemm.py) or ``cache=False`` (the trainer's forward of a
    weight being trained, whose packed copy would only go stale: the aligned GEMM's
    ``_OneDNNLinear`` makes the same exception; grad mode is off inside ``autograd.Function``)."""
    if cache:
        cached = _cached_panels(weight, dtype)
        if cached is not None:
            return cached
    with torch.no_grad():
        return _pack(weight.detach().resolve_neg().resolve_conj().to(dtype))[0]


#: the packed-weight cache's tag for panels of each rule's dtype
_PANEL_TAGS = {dtype: ("native-panels", dtype) for dtype in (torch.float32, torch.bfloat16)}


def _cached_panels(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``weight`` cast to ``dtype`` and packed, from the packed-weight cache; None where it refuses."""
    return cached_from_weight(weight, _PANEL_TAGS[dtype], lambda: _pack(weight.detach().to(dtype)))


def _uses_bf16_rule(x: torch.Tensor, weight: torch.Tensor, piece_k: int) -> bool:
    return x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and piece_k % 2 == 0


#: most pieces gemm.c sums itself (ZM_MAX_TREE_PIECES)
MAX_TREE_PIECES = 16


class PackedWeight(NamedTuple):
    """A weight already packed for gemm.c (``panels``), its ``[n, k]`` shape and the rule's dtype."""

    panels: torch.Tensor
    n: int
    k: int
    dtype: torch.dtype


def panel_gemm(
    x2d: torch.Tensor,
    weight: torch.Tensor | PackedWeight,
    pieces: int = 1,
    round_to: torch.dtype | None = None,
    reduce: bool = False,
    cache: bool = True,
) -> torch.Tensor:
    """``[pieces, M, N]`` fp32: piece p's ``x2d[:, piece p] @ weight[:, piece p].T`` by the gemm.c
    rule (bf16 rule when both are bf16 and the piece length is even, else fp32 on upcast inputs),
    each rounded to ``round_to`` when given (values stay fp32 tensors). With ``reduce`` (at most
    ``MAX_TREE_PIECES`` pieces), ``[M, N]``: those partials summed by ``collectives.tree_sum``'s
    fixed tree, bit for bit. ``weight`` may come packed (``PackedWeight``); ``cache=False`` packs it
    without caching (a weight being trained). No autograd."""
    prepacked = isinstance(weight, PackedWeight)
    require_cpu(x2d, weight.panels if prepacked else weight)
    m, k = x2d.shape
    if not isinstance(pieces, int) or pieces < 1 or k % pieces:
        raise ValueError(f"pieces must be a positive divisor of the input dim {k}, got {pieces!r}")
    if prepacked:
        n, dtype = weight.n, weight.dtype
        panel_k = weight.k if dtype == torch.float32 else weight.k // 2
        if (
            weight.k != k
            or dtype not in (torch.float32, torch.bfloat16)
            or (dtype == torch.bfloat16 and (k // pieces) % 2)
            or weight.panels.dim() < 3
            or weight.panels.shape[0] * PANEL < n
            or weight.panels.shape[1] != panel_k
        ):
            raise ValueError(
                f"packed weight (n={weight.n}, k={weight.k}, {weight.dtype}, panels "
                f"{tuple(weight.panels.shape)}) does not fit x2d with {k} columns in {pieces} pieces"
            )
    else:
        if weight.dim() != 2 or weight.shape[1] != k:
            raise ValueError(f"weight must be [N, {k}] for x2d {tuple(x2d.shape)}, got {tuple(weight.shape)}")
        n = weight.shape[0]
        dtype = torch.bfloat16 if _uses_bf16_rule(x2d, weight, k // pieces) else torch.float32
    if x2d.dtype != dtype:
        x2d = x2d.to(dtype)
    if x2d.is_neg() or x2d.is_conj():  # a lazy view: its storage does not hold its values
        x2d = x2d.resolve_neg().resolve_conj()
    if x2d.stride(-1) != 1 or x2d.stride(0) < k:  # the kernel reads rows ldx apart, each contiguous
        x2d = x2d.contiguous()
    if reduce and (pieces > MAX_TREE_PIECES or round_to not in (None, torch.float32, torch.bfloat16)):
        partials = panel_gemm(x2d, weight, pieces, round_to, cache=cache)
        return collectives.tree_sum_fp32_(list(partials.unbind(0)))
    if m == 0 or n == 0 or k == 0:
        out = torch.empty(*(() if reduce else (pieces,)), m, n, dtype=torch.float32, device=CPU)
        return out if k else out.zero_()
    packed = weight.panels if prepacked else _packed(weight, dtype, cache)
    out = _call(x2d, packed, k, dtype == torch.bfloat16, m, n, pieces, round_to == torch.bfloat16, reduce)
    if round_to is not None and round_to not in (torch.float32, torch.bfloat16):
        out = out.to(round_to).float()
    return out


def _call(x2d, packed, k, is_bf16, m, n, pieces, round_bf16, reduce) -> torch.Tensor:
    """gemm.c on checked inputs (x2d rows contiguous, in the rule's dtype; m, n, k >= 1)."""
    out = torch.empty(*(() if reduce else (pieces,)), m, n, dtype=torch.float32, device=CPU)
    status = _build.library().zm_panel_gemm(
        x2d.data_ptr(),
        x2d.stride(0),
        packed.data_ptr(),
        packed.shape[0],
        k,
        int(is_bf16),
        m,
        n,
        pieces,
        int(round_bf16),
        int(reduce),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:  # unreachable after the callers' checks; never return an unwritten buffer
        raise RuntimeError(f"zm_panel_gemm refused pieces={pieces} for input dim {k}")
    return out


def _engine_call(x2d: torch.Tensor, weight: torch.Tensor, pieces: int, round_partials: bool):
    """``panel_gemm(x2d, weight, pieces, reduce=True, round_to=x2d.dtype if round_partials else
    None).to(x2d.dtype)`` for the call an engine step makes -- no autograd; 2-D rows read in place;
    fp32, or bf16 with an even piece length; CPU; a weight the packed-weight cache holds -- with the
    checks in the order that is cheapest; None for anything else, which then takes the general path
    (and raises there for bad input). At one row the general path's checks cost as much as the GEMM
    itself (issue 3's M=1 rows: ~14 us against ~9 for the default's MKL call)."""
    dtype = x2d.dtype
    if dtype is not weight.dtype or not (dtype is torch.float32 or dtype is torch.bfloat16):
        return None
    if x2d.requires_grad and torch.is_grad_enabled():  # (a weight being trained: the cache refuses it)
        return None
    m, k = x2d.shape
    w_shape = weight.shape
    if m == 0 or k == 0 or len(w_shape) != 2 or w_shape[1] != k or w_shape[0] == 0:
        return None
    if k % pieces or pieces > MAX_TREE_PIECES or (dtype is torch.bfloat16 and (k // pieces) % 2):
        return None
    x_stride = x2d.stride()
    if not (x2d.is_cpu and weight.is_cpu) or x2d.is_neg() or x_stride[1] != 1 or x_stride[0] < k:
        return None  # (is_conj needs a complex dtype, excluded above)
    packed = _cached_panels(weight, dtype)
    if packed is None:
        return None
    n = w_shape[0]
    is_bf16 = dtype is torch.bfloat16
    nan_bits = -1  # an fp32 output
    if is_bf16:
        nan_bits = _TORCH_BF16_NAN_BITS if _TORCH_BF16_NAN_BITS is not None else _probe_nan_bits()
        if nan_bits < 0:  # a torch whose cast this file cannot name: the general path lets torch round
            return None
    # in x's dtype: a bf16 result is rounded as torch's cast rounds it, in C (the general path's
    # .to(bfloat16), the trainer's route, must give the same bits, nan encoding included)
    out = torch.empty(m, n, dtype=dtype, device=CPU)  # (whatever the default device)
    args = (x2d.data_ptr(), x_stride[0], packed.data_ptr(), packed.shape[0], k, is_bf16, m, n, pieces)
    status = _build.library().zm_panel_gemm_reduced(
        *args, round_partials and is_bf16, out.data_ptr(), nan_bits, torch.get_num_threads()
    )
    if status != 0:  # unreachable after the checks above, which are the kernel's own
        raise RuntimeError(f"zm_panel_gemm_reduced refused pieces={pieces} for input dim {k}")
    return out


#: the bf16 bits this process's torch writes for a nan when it casts fp32 to bf16, or -2 when that
#: is not one encoding (``torch_bf16_nan_bits``); None until the first bf16 engine call asks
_TORCH_BF16_NAN_BITS: int | None = None


def torch_bf16_nan_bits() -> int | None:
    """The encoding torch's fp32 -> bf16 cast gives every nan in this process: 0xffff from its
    vectorized (AVX2/AVX-512) conversion, 0x7fc0 from c10's scalar one (e.g. under
    ``ATEN_CPU_CAPABILITY=default``, found in review); None when it is not one encoding for every
    length and sign. Other values round to nearest even either way."""
    seen = set()
    for length in (1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 1000):
        # fp32 on the CPU whatever the default dtype and device (a bf16 default probed bf16 -> bf16)
        nans = torch.full((length,), float("nan"), dtype=torch.float32, device=CPU)
        nans[::2] = -nans[::2]
        seen.update(int(b) & 0xFFFF for b in nans.to(torch.bfloat16).view(torch.int16).unique().tolist())
    return seen.pop() if len(seen) == 1 else None


def _probe_nan_bits() -> int:
    global _TORCH_BF16_NAN_BITS
    bits = torch_bf16_nan_bits()
    _TORCH_BF16_NAN_BITS = -2 if bits is None else bits
    return _TORCH_BF16_NAN_BITS


class _NativeMatmul(torch.autograd.Function):
    """``compute()`` (``x2d @ weight.T`` by gemm.c, in some output dtype) with the plain gradient
    of that product, taken in the output's dtype: the trainer's backward needs no bitwise parity,
    and writing it out avoids recomputing a reference forward (``_autograd.py``) in every backward.
    The partials' rounding of the row-parallel form is treated as the identity, as torch's own
    low-precision GEMMs are. Once differentiable: a double backward is an error (``F.linear``
    supports one; nothing here needs it)."""

    @staticmethod
    def forward(ctx, compute, x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x2d, weight)
        return compute()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        refuse_double_backward()
        x2d, weight = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_x = grad_out.mm(weight.to(grad_out.dtype)).to(x2d.dtype)
        if ctx.needs_input_grad[2]:
            grad_w = grad_out.t().mm(x2d.to(grad_out.dtype)).to(weight.dtype)
        return None, grad_x, grad_w


def _product(x2d: torch.Tensor, weight: torch.Tensor, **panel_args) -> torch.Tensor:
    """``panel_gemm(x2d, weight, reduce=True, **panel_args)``, through ``_NativeMatmul`` when autograd
    needs a gradient (then a weight being trained is packed without caching)."""
    if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad):
        cache = not weight.requires_grad
        return _NativeMatmul.apply(
            lambda: panel_gemm(x2d, weight, reduce=True, cache=cache, **panel_args), x2d, weight
        )
    return panel_gemm(x2d, weight, reduce=True, **panel_args)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` semantics (weight ``[out, in]``, any leading dims) by the gemm.c rule, the result
    rounded to x's dtype once, then the bias added (as the aligned linear does)."""
    if bias is None and x.dim() == 2:
        out = _engine_call(x, weight, 1, round_partials=False)
        if out is not None:
            return out
    if x.dtype not in _NATIVE_DTYPES or weight.dtype not in _NATIVE_DTYPES:
        return aligned_dense.linear(x, weight, bias)
    aligned_dense._check_linear(x, weight, bias)
    flat = x.dim() != 2
    x2d = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if flat else x
    out = _product(x2d, weight)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0]) if flat else out


def quant_linear(x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The aligned weight-only quantized linear (deterministic dequantization, no scale spans the
    batch) with this module's GEMM: ``linear(x, dequantize(qweight, x.dtype), bias)``, bit for bit.
    Without autograd the packed panels are cached on the quantized tensors themselves, so no
    dequantized copy is kept, and the cache works even under inference mode, where a dequantized
    weight would be an inference tensor the packed-weight cache cannot key."""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
    n, k = qweight.shape
    if x.dtype in _NATIVE_DTYPES:  # (other dtypes take the aligned op, as on the CPU)
        # the quantized tensors too: their panels are packed where they live and read by gemm.c
        require_cpu(x, qweight.data, qweight.scales, qweight.global_scale, bias)
    if (
        x.dtype in _NATIVE_DTYPES
        and x.dim() >= 1
        and x.shape[-1] == k
        and k > 0
        and (bias is None or bias.shape == (n,))
        and not (torch.is_grad_enabled() and x.requires_grad)
    ):  # anything else takes the plain path below, which checks it and raises the one error
        rule = torch.bfloat16 if x.dtype == torch.bfloat16 and k % 2 == 0 else torch.float32
        tensors = (qweight.data, qweight.scales)
        if qweight.global_scale is not None:
            tensors += (qweight.global_scale,)
        tag = ("native-panels-dequantized", qweight.format, (n, k), qweight.block, x.dtype, rule)
        panels = cached_from_weights(tensors, tag, lambda: _pack(dequantize(qweight, x.dtype).to(rule)))
        if panels is not None:
            x2d = x.reshape(math.prod(x.shape[:-1]), k)
            out = panel_gemm(x2d, PackedWeight(panels, n, k, rule), reduce=True).to(x.dtype)
            if bias is not None:
                out = out + bias
            return out.reshape(*x.shape[:-1], n)
    return linear(x, cached_dequantize(qweight, x.dtype), bias)


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[T, V]`` of ``hidden [..., H]`` against ``weight [V, H]`` (module docstring)."""
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"lm_head: hidden {tuple(hidden.shape)} vs weight {tuple(weight.shape)}")
    h2d = hidden.reshape(math.prod(hidden.shape[:-1]), hidden.shape[-1])  # (-1 is ambiguous at H = 0)
    return _product(h2d, weight)


def _reference_pieces(pieces: int):
    def reference(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.stack(row_invariant_pieces(x2d, weight, pieces)).float()

    return reference


def _native_pieces(x2d: torch.Tensor, weight: torch.Tensor, pieces: int) -> list[torch.Tensor]:
    trained = torch.is_grad_enabled() and weight.requires_grad
    stacked = native_with_reference_backward(
        lambda: panel_gemm(x2d, weight, pieces, round_to=x2d.dtype, cache=not trained),
        _reference_pieces(pieces),
        x2d,
        weight,
    )
    return list(stacked.unbind(0))


def row_parallel_linear(
    x_local: torch.Tensor,
    weight_local: torch.Tensor,
    bias: torch.Tensor | None = None,
    group=None,
    virtual_shards: int = 4,
) -> torch.Tensor:
    if x_local.dtype not in _NATIVE_DTYPES or weight_local.dtype not in _NATIVE_DTYPES:
        return aligned_dense.row_parallel_linear(x_local, weight_local, bias, group, virtual_shards)
    aligned_dense._check_linear(x_local, weight_local, None)
    flat = x_local.dim() != 2
    x2d = x_local.reshape(math.prod(x_local.shape[:-1]), x_local.shape[-1]) if flat else x_local
    if group is None:
        # TP 1: the partials and their tree in one call (the same bits as gathering them)
        collectives.check_virtual_shards(x2d.shape[1], 1, virtual_shards)
        out = _engine_call(x2d, weight_local, virtual_shards, round_partials=True) if bias is None else None
        if out is not None:
            return out.reshape(*x_local.shape[:-1], weight_local.shape[0]) if flat else out
        out = _product(x2d, weight_local, pieces=virtual_shards, round_to=x2d.dtype)
    else:
        out = collectives.virtual_shard_reduce(x2d, weight_local, group, virtual_shards, _native_pieces)
    if out.dtype != x_local.dtype:
        out = out.to(x_local.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x_local.shape[:-1], weight_local.shape[0]) if flat else out
