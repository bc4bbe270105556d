"""Native Mamba2 causal conv1d (conv.c): the depthwise conv of packed sequences with state, one call.

Why. The pure-torch aligned conv pads the sequences, concatenates the state, and runs one product
and one sum per tap plus the activation and the state gather: about a dozen torch ops, 0.2 ms per
call at a tiny-nemotron-h decode step, 0.4 of its ~4 ms (measured).

What. conv.c computes each (sequence, channel) alone: the window [state, inputs] in fp32, the taps'
products summed in the aligned conv's order, plus the bias, then fixed_math.h's silu (or none),
rounded to x's dtype; the new state is the window's last W-1 values (conv.c states the rule).
Without an activation its bits are the pure-torch aligned conv's (tested, a bf16 nan's encoding
included); with silu they differ.

x and the state share x's dtype, fp32 or bf16 (a state of another dtype is cast first, as the
aligned conv does); other dtypes, and conv widths above 16, keep the aligned op. 16 channels are
computed per vector step (fixed_math.h's zm_silu16 gives zm_silu's bits lane for lane). The
backward is the aligned op's gradient (``_autograd.py``). CPU only: a tensor on another device
(cu_seqlens included) raises ValueError (``_device.py``).
"""

from __future__ import annotations

import torch

from ..aligned import ssm as aligned_ssm
from . import _build
from ._autograd import native_with_reference_backward
from ._device import CPU, require_cpu

_C_DTYPES = (torch.float32, torch.bfloat16)
#: widest conv conv.c takes (MAX_TAPS); wider ones keep the aligned op (Mamba2 uses 4)
_MAX_TAPS = 16


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    activation: str = "silu",
    state_slots: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv over packed sequences by the conv.c rule (module docstring)."""
    slots = (state_slots, has_initial_state)
    cu, width = aligned_ssm.check_conv(x, weight, bias, cu_seqlens, conv_state, activation, *slots)
    tensors = [t for t in (x, weight, bias, conv_state) if t is not None]
    if x.dtype not in _C_DTYPES or width > _MAX_TAPS:
        return aligned_ssm.causal_conv1d(x, weight, bias, cu_seqlens, conv_state, activation, *slots)
    if state_slots is not None and not aligned_ssm.updatable_in_place(conv_state, x.dtype):
        # a store the C cannot update in place: only the batch's rows may change (found in review: a
        # whole-store round trip through x's dtype rounded the other slots), so gather and scatter
        return aligned_ssm.through_slots(
            conv_state,
            state_slots,
            has_initial_state,
            lambda state: causal_conv1d(x, weight, bias, cu_seqlens, state, activation),
        )
    require_cpu(*tensors, cu, *(t for t in slots if t is not None))  # the C reads cu and slots from memory
    num_seqs, channels = cu.numel() - 1, x.shape[1]

    def forward():
        xs = x.detach().resolve_neg()
        if xs.stride(1) != 1 or (xs.shape[0] > 1 and xs.stride(0) < channels):
            xs = xs.contiguous()
        w32 = weight.detach().resolve_neg().float().contiguous()
        b32 = None if bias is None else bias.detach().resolve_neg().float().contiguous()
        state = None if conv_state is None else conv_state.detach().resolve_neg().to(x.dtype).contiguous()
        cu64 = cu.contiguous()
        y = torch.empty(x.shape[0], channels, dtype=x.dtype, device=CPU)
        if state_slots is None:
            new_state = torch.empty(num_seqs, channels, width - 1, dtype=x.dtype, device=CPU)
        else:  # the store's rows are updated in place
            new_state = state
        status = _build.library().zm_causal_conv1d(
            xs.data_ptr(),
            x.dtype == torch.bfloat16,
            xs.stride(0) if xs.shape[0] > 1 else channels,
            channels,
            w32.data_ptr(),
            width,
            None if b32 is None else b32.data_ptr(),
            cu64.data_ptr(),
            num_seqs,
            None if state is None else state.data_ptr(),
            None if state_slots is None else state_slots.contiguous().data_ptr(),
            None if has_initial_state is None else has_initial_state.contiguous().data_ptr(),
            activation == "silu",
            y.data_ptr(),
            new_state.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:  # unreachable: the width was checked above
            raise RuntimeError(f"zm_causal_conv1d refused conv width {width}")
        return y, new_state if state_slots is None else conv_state

    def reference(x_, weight_, *optional):  # optional: bias, then conv_state, each when given
        rest = iter(optional)
        bias_ = None if bias is None else next(rest)
        state_ = None if conv_state is None else next(rest)
        # (never with state_slots: those are refused under autograd, so no backward reaches here)
        return aligned_ssm.causal_conv1d(x_, weight_, bias_, cu_seqlens, state_, activation)

    return native_with_reference_backward(forward, reference, *tensors)
