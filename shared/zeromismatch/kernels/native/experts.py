"""Native routed MoE experts (moe.c): every expert's two GEMMs, the activation and the weighted
slot sum in one C call.

Why. The aligned ``moe_experts`` runs about eight torch ops per active expert (row slices, two
oneDNN GEMMs, the activation, a cat) plus the grouping and the slot sum: at a decode step of 32
tokens with 8 experts that was 0.6 ms per layer for ~1.5 MFLOP, 1.2 of a 3.5 ms tiny-qwen3-moe
engine step (measured). Here one call does the lot.

What. moe.c groups the (token, slot) pairs by expert with a stable counting sort, runs each
expert's rows through the fused gate/up GEMM and the down GEMM of ``gemm.c`` (whose outputs depend
on their row and column alone, so the grouping never changes a token's bits), applies silu with
fixed_math.h's exp (or relu2, exact), and sums the slots' weighted outputs in slot order in fp32,
rounding once to x's dtype -- the aligned op's structure (moe.c states the rule). The weights are
packed per expert once and cached while unchanged; where the cache refuses (a weight being
trained, an inference-mode weight, or one layer's experts larger than a quarter of the cache's
budget) every expert is packed on each call, which costs more than the default op (a review
measured 10-42x the cached time under inference mode).

x and the expert weights share one dtype, fp32 or bf16 (other or mixed dtypes take the aligned
op, which computes or refuses them); the backward is the aligned op's gradient (``_autograd.py``).
The silu experts' bits differ from the pure-torch aligned set's. CPU only (``_device.py``).
"""

from __future__ import annotations

import torch

from ..aligned import moe as aligned_moe
from ..weight_cache import cached_from_weights
from . import _build
from ._autograd import native_with_reference_backward
from ._device import CPU, require_cpu
from .gemm import _pack, _uses_bf16_rule

_C_DTYPES = (torch.float32, torch.bfloat16)


def _packed_experts(stacked: tuple[torch.Tensor, ...], dtype: torch.dtype, cache: bool) -> torch.Tensor:
    """``[E, *panels]``: expert e's ``cat([w[e] for w in stacked])`` packed for gemm.c in ``dtype``."""

    def build():
        with torch.no_grad():
            panels = torch.stack(
                [
                    _pack(torch.cat([w[e] for w in stacked]).detach().to(dtype))[0]
                    for e in range(stacked[0].shape[0])
                ]
            )
        return panels, panels.numel() * panels.element_size()

    cached = cached_from_weights(stacked, ("native-expert-panels", dtype), build) if cache else None
    return build()[0] if cached is None else cached


def moe_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate: torch.Tensor | None,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed experts by the moe.c rule (module docstring); each token independent of its batch."""
    aligned_moe.check_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)
    weights = [w for w in (w_gate, w_up, w_down) if w is not None]
    if x.dtype not in _C_DTYPES or any(w.dtype != x.dtype for w in weights):
        # another dtype, or mixed dtypes (the aligned op's error)
        return aligned_moe.moe_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)
    require_cpu(x, topk_weights, topk_ids, *weights)
    if x.shape[0] == 0:
        return aligned_moe.moe_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)
    num_experts, inter, hidden = w_up.shape
    up_stack = (w_up,) if w_gate is None else (w_gate, w_up)
    # the rule gemm.linear would take for each GEMM
    up_rule = torch.bfloat16 if _uses_bf16_rule(x, w_up, hidden) else torch.float32
    down_rule = torch.bfloat16 if _uses_bf16_rule(x, w_down, inter) else torch.float32

    # decided here: inside the autograd function's forward grad mode is off
    trained = torch.is_grad_enabled() and any(w.requires_grad for w in weights)

    def forward():
        up = _packed_experts(up_stack, up_rule, cache=not trained)
        down = _packed_experts((w_down,), down_rule, cache=not trained)
        xc = x.detach().resolve_neg().contiguous()
        # resolve_neg: the C reads raw storage, which a lazily negated view does not hold negated
        ids = topk_ids.detach().resolve_neg().to(torch.int64).contiguous()
        slot_weights = topk_weights.detach().resolve_neg().float().contiguous()
        out = torch.empty(x.shape[0], hidden, dtype=torch.float32, device=CPU)
        status = _build.library().zm_moe_experts(
            xc.data_ptr(),
            x.dtype == torch.bfloat16,
            x.shape[0],
            hidden,
            ids.data_ptr(),
            slot_weights.data_ptr(),
            ids.shape[1],
            num_experts,
            inter,
            w_gate is not None,
            up.data_ptr(),
            up[0].numel(),
            up.shape[1],
            up_rule == torch.bfloat16,
            down.data_ptr(),
            down[0].numel(),
            down.shape[1],
            down_rule == torch.bfloat16,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if status == -1:
            raise MemoryError("aligned-native moe_experts could not allocate its scratch memory")
        if status == 2:
            raise ValueError(f"topk_ids must be in [0, {num_experts})")
        if status != 0:  # unreachable: the shapes above are ones gemm.c takes
            raise RuntimeError(f"zm_moe_experts failed with status {status}")
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def reference(x_, weights_, *expert_weights):
        gate = expert_weights[0] if w_gate is not None else None
        return aligned_moe.moe_experts(x_, weights_, topk_ids, gate, *expert_weights[-2:], activation)

    return native_with_reference_backward(forward, reference, x, topk_weights, *weights)
