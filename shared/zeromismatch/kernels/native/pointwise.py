"""Native RMSNorm, gated RMSNorm and RoPE (pointwise.c): row-local ops without torch's op chain.

Why. These ops do little arithmetic, but torch 2.13 runs ``F.rms_norm`` on the CPU as a chain of
five ops (pow, mean, add, rsqrt, mul; ~14 us for [32, 128] rows at 1 thread, more under a profiler)
and the aligned rope as about a dozen (angles, cos, sin, four products, two sums, a cat, casts;
~43 us for a decode step's [32, 6, 64] q/k heads): in a tiny-qwen3 engine step they took 0.3 and
0.15 of 3.1 ms. Each is one C call here (~9 and ~10 us, ctypes included).

What.
- ``rms_norm``: per row, the sum of squares in 16 strided lanes joined by the fixed tree the
  native attention uses, ``r = 1 / sqrt(ss / h + eps)``, ``x * r`` rounded to x's dtype, times the
  weight (pointwise.c states the rule). Its bits differ from the pure-torch aligned op's (torch's
  reduction order is not one this file can name), so engine and trainer both run this set.
- ``gated_rms_norm``: the aligned op's fp32 ``silu(gate) * x`` (torch), then the same rule per group.
- ``rope``: the aligned rope's arithmetic exactly, with cos/sin read from a per-``inv_freq`` table
  of the first ROPE_TABLE_POSITIONS positions computed once by torch (the same ``torch.cos`` /
  ``torch.sin`` of the same fp32 angles): the same bits as the pure-torch aligned rope (tests), in
  one call. Positions outside the table, and an ``inv_freq`` the packed-weight cache may not hold
  (an inference tensor, or one that needs a gradient), run the aligned rope itself.

Inputs are fp32 or bf16; the C reads rows through two strides (a q/k head view of a fused qkv is
read in place; a view whose leading dims cannot be merged is copied first). Other dtypes keep the
aligned ops. The backward is the aligned ops' gradient (``_autograd.py``). CPU only: a tensor on
another device raises ValueError (``_device.py``; rope too, though its bits would match).
"""

from __future__ import annotations

import math

import torch

from ..aligned import dense as aligned_dense
from ..weight_cache import cached_from_weights
from . import _build
from ._autograd import native_with_reference_backward
from ._device import require_cpu

_C_DTYPES = (torch.float32, torch.bfloat16)
#: positions a rope table covers (2 MiB of fp32 cos/sin at head dim 64); a call reaching further
#: runs the aligned rope, whose bits are the same
ROPE_TABLE_POSITIONS = 8192


def _c_dtypes(*tensors: torch.Tensor) -> bool:
    return all(t.dtype in _C_DTYPES for t in tensors)


def _row_view(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int, int]:
    """``(x', rows_a, rows_b, stride_a, stride_b)``: the rows of x (last dim) as row (a, b) at
    ``a * stride_a + b * stride_b``; x' is x when that describes it, else a contiguous copy."""
    if x.is_neg() or x.is_conj():  # raw pointers: a lazily negated view shares un-negated storage
        x = x.resolve_neg().resolve_conj()
    if x.is_contiguous():  # the common case, checked first: a decode step calls this per norm
        return x, 1, x.numel() // x.shape[-1], 0, x.shape[-1]
    if x.dim() >= 2 and x.stride(-1) == 1:
        lead = x.shape[:-2]
        try:
            x3 = x.view(math.prod(lead), x.shape[-2], x.shape[-1]) if lead else x.unsqueeze(0)
        except RuntimeError:  # leading dims that cannot be merged without a copy
            x3 = None
        if x3 is not None:
            return x, x3.shape[0], x3.shape[1], x3.stride(0), x3.stride(1)
    x = x.contiguous()
    return x, 1, x.numel() // x.shape[-1], 0, x.shape[-1]


def _norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: int,
    n_dtype: torch.dtype,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The pointwise.c norm of x's rows (x has at least one element)."""
    xv, rows_a, rows_b, stride_a, stride_b = _row_view(x)
    if weight.is_neg() or not weight.is_contiguous():
        weight = weight.resolve_neg().contiguous()
    out = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    _build.library().zm_rms_norm(
        xv.data_ptr(),
        xv.dtype == torch.bfloat16,
        rows_a,
        rows_b,
        stride_a,
        stride_b,
        x.shape[-1],
        group,
        n_dtype == torch.bfloat16,
        weight.data_ptr(),
        weight.dtype == torch.bfloat16,
        eps,
        out.data_ptr(),
        out_dtype == torch.bfloat16,
        torch.get_num_threads(),
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` by the pointwise.c rule."""
    if not _c_dtypes(x, weight) or x.dim() == 0 or weight.shape != x.shape[-1:]:
        return aligned_dense.rms_norm(x, weight, eps)  # another dtype, or the op's own error
    require_cpu(x, weight)
    if x.numel() == 0:
        return aligned_dense.rms_norm(x, weight, eps)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    return native_with_reference_backward(
        lambda: _norm(x, weight, eps, x.shape[-1], x.dtype, out_dtype),
        lambda x_, w_: aligned_dense.rms_norm(x_, w_, eps),
        x,
        weight,
    )


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    """The aligned ``silu(gate_f32) * x``, then the pointwise.c rule over each group of a row."""
    aligned_dense.check_gated_rms_norm(x, gate, weight, group_size)
    if not _c_dtypes(x, gate, weight):
        return aligned_dense.gated_rms_norm(x, gate, weight, eps, group_size)
    require_cpu(x, gate, weight)
    if x.numel() == 0:
        return aligned_dense.gated_rms_norm(x, gate, weight, eps, group_size)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)

    def forward():
        with torch.no_grad():
            return _norm(aligned_dense.gated_hidden(x, gate), weight, eps, group_size, x.dtype, out_dtype)

    return native_with_reference_backward(
        forward,
        lambda x_, g_, w_: aligned_dense.gated_rms_norm(x_, g_, w_, eps, group_size),
        x,
        gate,
        weight,
    )


def _rope_table(inv_freq: torch.Tensor) -> torch.Tensor | None:
    """fp32 ``[ROPE_TABLE_POSITIONS, 2, half]``: cos and sin of ``position * inv_freq``, elementwise
    the values the aligned rope computes; cached while inv_freq is unchanged. None when inv_freq
    may not be cached (an inference tensor, or one that needs a gradient): building a table per call
    would cost more than the aligned rope."""

    def build():
        angles = aligned_dense.rope_angles(torch.arange(ROPE_TABLE_POSITIONS), inv_freq.detach())
        table = torch.stack((torch.cos(angles), torch.sin(angles)), dim=1).contiguous()
        return table, table.numel() * table.element_size()

    return cached_from_weights((inv_freq,), ("rope-table", ROPE_TABLE_POSITIONS), build)


def _rope_forward(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool):
    """The C rope, or None when a position has no table row (the caller runs the aligned rope)."""
    table = _rope_table(inv_freq)
    if table is None:
        return None
    if x.is_neg() or x.is_conj():  # raw pointers: a lazily negated view shares un-negated storage
        x = x.resolve_neg().resolve_conj()
    if x.stride(-1) != 1:
        x = x.contiguous()
    if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.is_neg():
        positions = positions.resolve_neg().to(torch.int64).contiguous()
    tokens, heads, d = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    missed = _build.library().zm_rope(
        x.data_ptr(),
        x.dtype == torch.bfloat16,
        tokens,
        heads,
        x.stride(0),
        x.stride(1),
        d // 2,
        positions.data_ptr(),
        table.data_ptr(),
        ROPE_TABLE_POSITIONS,
        bool(interleaved),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return None if missed else out


def rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """The aligned rope, bit for bit, in one call (module docstring); the aligned rope itself for
    positions outside the table, fractional positions, other dtypes and an uncacheable inv_freq."""
    aligned_dense.check_rope(x, positions, inv_freq)

    def reference(x_: torch.Tensor) -> torch.Tensor:
        return aligned_dense.rope(x_, positions, inv_freq, interleaved)

    if (
        not _c_dtypes(x)
        or positions.dtype.is_floating_point
        or positions.dtype.is_complex
        or inv_freq.dtype != torch.float32
    ):
        return reference(x)
    require_cpu(x, positions, inv_freq)
    if torch.is_grad_enabled() and inv_freq.requires_grad:  # its gradient flows through the aligned op
        return reference(x)
    with torch.no_grad():
        out = _rope_forward(x, positions, inv_freq, interleaved)
    if out is None:
        return reference(x)
    return native_with_reference_backward(lambda: out, reference, x)
