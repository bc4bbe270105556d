"""A spec'd MoE MLP for Qwen3-MoE: the router and the routed experts on the KernelSet.

Megatron's own ``MoELayer`` routes with its ``TopKRouter`` (torch softmax/top-k, its own tie
handling) and dispatches tokens through its token dispatchers before grouped expert GEMMs; none of
that is the KernelSet's arithmetic. This module takes the ``mlp`` slot of ``TransformerLayer``
instead and computes exactly what the project's ``SparseMoeBlock`` computes: router logits by
``kernels.linear`` in the activation dtype, ``kernels.moe_route`` (softmax top-k, ties to the lower
expert id), ``kernels.moe_experts`` over stacked SwiGLU experts.

Parameters: ``router.weight [E, H]`` and ``experts.{gate,up,down}_weight`` stacked ``[E, I, H]`` /
``[E, H, I]`` (HF keeps one tensor per expert; ``weights.py`` stacks them). Router and experts are
replicated over TP ranks, as the project's tensor parallelism keeps them (the ``moe_experts``
contract has no TP split): every rank computes the same output, so no reduction is needed and every
rank's gradient is complete.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule
from torch.nn import Parameter

from .layers import KernelSlot


class KernelMoEExperts(torch.nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype):
        super().__init__()
        self.gate_weight = Parameter(torch.empty(num_experts, intermediate, hidden, dtype=dtype))
        self.up_weight = Parameter(torch.empty(num_experts, intermediate, hidden, dtype=dtype))
        self.down_weight = Parameter(torch.empty(num_experts, hidden, intermediate, dtype=dtype))


class KernelSoftmaxMoE(MegatronModule):
    """Qwen3-MoE's sparse MLP (routed experts only) in the ``mlp`` slot of a ``TransformerLayer``."""

    def __init__(
        self, config, *, kernels: KernelSlot, num_experts: int, top_k: int, intermediate_size: int,
        norm_topk_prob: bool,
    ):  # fmt: skip
        super().__init__(config=config)
        self.slot = kernels
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        dtype = config.params_dtype
        self.router = torch.nn.Module()
        self.router.weight = Parameter(torch.empty(num_experts, config.hidden_size, dtype=dtype))
        self.experts = KernelMoEExperts(num_experts, config.hidden_size, intermediate_size, dtype)

    def forward(self, hidden_states: torch.Tensor, **_unused):
        kern = self.slot.kernels
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = kern.linear(x, self.router.weight.to(x.dtype))
        weights, ids = kern.moe_route(
            logits, self.top_k, scoring="softmax", norm_topk_prob=self.norm_topk_prob
        )
        e = self.experts
        out = kern.moe_experts(x, weights, ids, e.gate_weight, e.up_weight, e.down_weight, activation="silu")
        return out.reshape(hidden_states.shape), None
