"""Native forward, pure-torch backward: the one autograd wrapper both native ops use.

The native kernels compute the forward (what engine and trainer compare bit for bit); their
gradient is the pure-torch aligned op's, recomputed from the saved inputs -- the same function
up to fp32 rounding, and gradients need no bitwise parity. Once differentiable: a double
backward (``create_graph=True``) is an error, not a silently missing second-order term.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def refuse_double_backward() -> None:
    """Raise when a backward runs with ``create_graph=True`` (grad mode is then on inside it).
    ``once_differentiable`` alone raises only if the incoming gradients need a gradient; with
    ``y.sum()`` they do not, and the second-order term would vanish silently (found in review)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "the aligned-native kernels have no double backward (a backward with create_graph=True); "
            "use the aligned kernel set for higher-order gradients"
        )


class _NativeWithReferenceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward_fn, reference_fn, *inputs):
        ctx.reference_fn = reference_fn
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not zeros
        ctx.save_for_backward(*inputs)
        return forward_fn()

    @staticmethod
    def backward(ctx, *grad_outputs):
        refuse_double_backward()
        with torch.enable_grad():
            needs = ctx.needs_input_grad[2:]  # after forward_fn and reference_fn
            detached = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, needs)]
            outputs = ctx.reference_fn(*detached)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            wanted = [t for t in detached if t.requires_grad]
            # only outputs with an incoming gradient that depend on a wanted input (e.g. the scan's
            # final state does not depend on C or D)
            pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
            grads = (
                torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                if pairs
                else [None] * len(wanted)
            )
        grads = iter(grads)
        return (None, None, *(next(grads) if t.requires_grad else None for t in detached))


def native_with_reference_backward(
    forward_fn: Callable[[], object], reference_fn: Callable[..., object], *inputs: torch.Tensor
):
    """``forward_fn()`` (a tensor or a tuple of tensors); when autograd needs a gradient of any of
    ``inputs``, wrapped so that backward differentiates ``reference_fn(*inputs)`` instead."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
        return forward_fn()
    return _NativeWithReferenceBackward.apply(forward_fn, reference_fn, *inputs)
