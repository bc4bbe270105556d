"""Native SwiGLU product (swiglu.c): ``silu(gate) * up`` in one pass, for the aligned-native set.

Why. The aligned ``silu_mul`` is torch's ``F.silu`` then an in-place ``mul_`` (row-invariant where
torch's vector loop covers the whole buffer, which it checks per call): two kernel launches and two
passes over memory. One C call does both, with its own fixed silu: ~1.4-1.7x the default op from
64 rows. A one-row call is a few microseconds of checks and allocation around ~0.4 us of
arithmetic: in Python they made it 0.64-0.81x of the default (session 14), so the engine's and the
benchmark's case is now read in C (pyshim.c's ``silu_mul_tensors``; every other input takes the
general path below).

What. Per element, ``g / (1 + exp(-g))`` times ``up`` in fp32 with swiglu.c's exp (fixed_math.h's
Cody-Waite reduction and degree-7 polynomial, each step one fused multiply-add), rounded once to the
inputs' dtype. The AVX-512 path and the portable path (fmaf; the -O0 test build) give the same
bits, and an element's bits depend on its gate and up values alone. These are not the pure-torch
aligned op's bits (nor those of zm_silu, which the native MoE experts and conv use), so engine and
trainer both run this set. fp32 and bf16 in matching shapes and dtypes; anything else takes the
aligned op (and its errors). Backward: the aligned op's gradient (``_autograd.py``). CPU only.
"""

from __future__ import annotations

import torch

from ..aligned import dense as aligned_dense
from . import _build
from ._autograd import native_with_reference_backward
from ._device import CPU, require_cpu


def _rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(t', row_stride)``: t (or a copy of it) as rows of its last dim, each with unit inner stride,
    ``row_stride`` elements apart."""
    if t.is_neg():  # raw pointers: a lazily negated view shares un-negated storage
        t = t.resolve_neg()
    cols = t.shape[-1]
    if t.stride(-1) != 1 and cols > 1:
        t = t.contiguous()
    try:
        rows = t.view(-1, cols)
    except RuntimeError:  # leading dims that cannot be merged without a copy
        rows = t.contiguous().view(-1, cols)
    return rows, rows.stride(0)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """swiglu.c on same-shape, same-dtype (fp32 or bf16) CPU tensors with at least one dim; no autograd."""
    out = torch.empty(*gate.shape, dtype=gate.dtype, device=CPU)
    cols = gate.shape[-1]
    if out.numel() == 0:
        return out
    g, g_stride = _rows_of(gate)
    u, u_stride = _rows_of(up)
    bf16, rows, threads = gate.dtype is torch.bfloat16, out.numel() // cols, torch.get_num_threads()
    call = _build.library().zm_silu_mul
    call(g.data_ptr(), u.data_ptr(), bf16, rows, cols, g_stride, u_stride, out.data_ptr(), threads)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` by the swiglu.c rule (module docstring)."""
    # the engine's call (a [T, I] slice pair of the fused gate/up output) and the benchmark's: the
    # checks, the output and the call in C (pyshim.c), which declines (None) anything else. In
    # Python they were ~2 us of a one-row call that torch's silu-then-multiply makes in ~2.5 us.
    tensor_call = _build.library().silu_mul_tensors
    if tensor_call is not None:
        out = tensor_call(gate, up)
        if out is not None:
            return out
    shape = gate.shape
    dtype = gate.dtype
    if shape != up.shape or dtype is not up.dtype or not (dtype is torch.float32 or dtype is torch.bfloat16):
        return aligned_dense.silu_mul(gate, up)  # another dtype, or the op's own error
    require_cpu(gate, up)
    if not shape:
        return aligned_dense.silu_mul(gate, up)  # a scalar
    if (gate.requires_grad or up.requires_grad) and torch.is_grad_enabled():
        return native_with_reference_backward(
            lambda: _silu_mul(gate.detach(), up.detach()), aligned_dense.silu_mul, gate, up
        )
    return _silu_mul(gate, up)
