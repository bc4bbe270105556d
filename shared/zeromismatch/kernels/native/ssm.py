"""Native Mamba2 selective scan: the aligned recurrence in C, one thread per (sequence, head).

The pure-torch aligned scan (``kernels/aligned/ssm.py``) already runs the recurrence in one
order for every phase, but as a handful of torch ops per token, so a 512-token prefill is
thousands of small calls. ``ssm.c`` runs the same recurrence -- ``h = (h * exp(dt A)) +
((dt B) x)``, ``y = h . C + D x`` -- token by token with the state in cache, every value one
fixed sequence of IEEE operations (its header states them; the readout sums in 16 strided lanes
and a fixed tree, ``exp``/``log`` are fixed polynomials), so one call over a sequence, any split
of it carrying the state, and single decode steps give identical bits, by construction.

Its bits differ from the pure-torch scan's (another readout order and other exp/log), so engine
and trainer must both run this set. Arithmetic and the returned state are fp32; y comes back in
x's dtype. The backward recomputes the pure-torch aligned scan's gradient (gradients need no
bitwise parity). CPU only.
"""

from __future__ import annotations

import torch

from ..aligned import ssm as aligned_ssm
from . import _build
from ._autograd import native_with_reference_backward
from ._device import CPU, require_cpu


def _forward(x, dt, A, B, C, D, dt_bias, cu, ssm_state, dt_limit, slots) -> tuple[torch.Tensor, torch.Tensor]:
    state_slots, has_initial_state = slots
    require_cpu(x, dt, A, B, C, D, dt_bias, ssm_state, cu, *slots)  # cu and slots too: the C reads them
    total, heads, head_dim = x.shape
    groups, n_state = B.shape[1], B.shape[2]
    num_seqs = cu.numel() - 1
    starts = cu[:-1].to(torch.int64).contiguous()
    lens = (cu[1:] - cu[:-1]).to(torch.int64).contiguous()

    def f32(t):
        # resolve_neg/conj: a lazily negated view shares its storage un-negated; C reads raw memory
        return t.detach().resolve_neg().resolve_conj().to(torch.float32).contiguous()

    def f32_rows(t):
        """fp32 with each token's values contiguous, and the token stride: a column slice of the
        mixer's projection is read in place rather than copied (about 8 us a copy at a decode step)"""
        t = t.detach().resolve_neg().resolve_conj().to(torch.float32)
        if t.shape[0] and not t[0].is_contiguous():
            t = t.contiguous()
        return t, (t.stride(0) if t.shape[0] > 1 else t[0].numel() if t.shape[0] else 0)

    (x32, x_row), (dt32, dt_row), (b32, b_row), (c32, c_row) = (f32_rows(t) for t in (x, dt, B, C))
    a32, d32, bias32 = (f32(t) for t in (A, D, dt_bias))
    state_in = None if ssm_state is None else f32(ssm_state)
    if state_slots is None:
        state_out = torch.empty(num_seqs, heads, head_dim, n_state, dtype=torch.float32, device=CPU)
    else:  # the store's rows are updated in place (ssm_scan sends other stores through a gather)
        state_out = state_in
    y = torch.empty(total, heads, head_dim, dtype=torch.float32, device=CPU)
    status = _build.library().zm_ssm_scan(
        x32.data_ptr(),
        dt32.data_ptr(),
        a32.data_ptr(),
        b32.data_ptr(),
        c32.data_ptr(),
        d32.data_ptr(),
        bias32.data_ptr(),
        starts.data_ptr(),
        lens.data_ptr(),
        None if state_in is None else state_in.data_ptr(),
        None if state_slots is None else state_slots.contiguous().data_ptr(),
        None if has_initial_state is None else has_initial_state.contiguous().data_ptr(),
        state_out.data_ptr(),
        y.data_ptr(),
        num_seqs,
        heads,
        head_dim,
        groups,
        n_state,
        x_row,
        dt_row,
        b_row,
        c_row,
        float(dt_limit[0]),
        float(dt_limit[1]),
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("aligned-native ssm_scan could not allocate its scratch memory")
    y = y if x.dtype == torch.float32 else y.to(x.dtype)
    return y, state_out if state_slots is None else ssm_state


def ssm_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ssm_state: torch.Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    state_slots: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba2 selective scan in recurrent order, in C (see module docstring)."""
    slots = (state_slots, has_initial_state)
    cu = aligned_ssm.check_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, *slots)
    aligned_ssm.check_dt_limit(dt_limit)
    if state_slots is not None and not aligned_ssm.updatable_in_place(ssm_state, torch.float32):
        # a store the C cannot update in place: gather the batch's rows and scatter them back
        return aligned_ssm.through_slots(
            ssm_state,
            state_slots,
            has_initial_state,
            lambda state: ssm_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, state, dt_limit),
        )
    inputs = (x, dt, A, B, C, D, dt_bias) + (() if ssm_state is None else (ssm_state,))

    def forward():
        return _forward(x, dt, A, B, C, D, dt_bias, cu, ssm_state, dt_limit, slots)

    def reference(*tensors):
        state = tensors[7] if len(tensors) > 7 else None
        # (never with state_slots: those are refused under autograd, so no backward reaches here)
        return aligned_ssm.ssm_scan(*tensors[:7], cu_seqlens, state, dt_limit)

    return native_with_reference_backward(forward, reference, *inputs)
