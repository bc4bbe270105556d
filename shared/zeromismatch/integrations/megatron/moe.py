"""Spec'd MoE MLPs: the router, the routed and the shared experts on the KernelSet.

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
rank's gradient is complete. Fake-quantized (``quantized.py``), each expert's weight is
``dequantize(quantize(w), fp32)``, then cast, as in the project's ``Experts``.

``KernelSharedRoutedMoE`` is the DeepSeek-V3 / Nemotron-H block (``models.moe.SharedRoutedMoe``):
fp32 router logits (``kernels.linear`` on fp32 copies; router weight and ``e_score_correction_bias``
kept fp32 in every dtype, as the project keeps them), sigmoid group-limited ``moe_route``, routed
experts (SwiGLU or relu2, optionally between Nemotron-H's replicated latent projections) plus the
shared experts, a spec'd MLP (column/row parallel like any MLP), added as ``routed + shared``.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module
from torch.nn import Parameter

from .layers import KernelSlot


class KernelMoEExperts(torch.nn.Module):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype, gated=True):
        super().__init__()
        gate = Parameter(torch.empty(num_experts, intermediate, hidden, dtype=dtype)) if gated else None
        self.gate_weight = gate
        self.up_weight = Parameter(torch.empty(num_experts, intermediate, hidden, dtype=dtype))
        self.down_weight = Parameter(torch.empty(num_experts, hidden, intermediate, dtype=dtype))
        self.fake_quant = None  # {attr: MegatronFakeQuantizer} once fake-quantized (quantized.py)

    def weights(self, dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(gate, up, down) in ``dtype``; fake-quantized, each expert ``dequantize(quantize(w), fp32)``
        then cast, as the project's fake-quantized ``Experts`` builds them."""

        def one(attr):
            weight = getattr(self, attr)
            if weight is None:
                return None
            if self.fake_quant is not None:
                weight = self.fake_quant[attr](weight, torch.float32)
            return weight.to(dtype)

        return one("gate_weight"), one("up_weight"), one("down_weight")


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
        gate, up, down = self.experts.weights(x.dtype)
        out = kern.moe_experts(x, weights, ids, gate, up, down, activation="silu")
        return out.reshape(hidden_states.shape), None


class KernelSharedRoutedMoE(MegatronModule):
    """DeepSeek-V3's / Nemotron-H's MoE block in the ``mlp`` slot (module docstring)."""

    def __init__(
        self, config, *, kernels: KernelSlot, num_experts: int, top_k: int, intermediate_size: int,
        norm_topk_prob: bool, n_group: int, topk_group: int, routed_scaling_factor: float, gated: bool,
        shared_experts, latent_size: int | None = None, latent_proj=None, latent_bias: bool = False,
    ):  # fmt: skip
        super().__init__(config=config)
        self.slot = kernels
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.n_group, self.topk_group, self.scaling = n_group, topk_group, routed_scaling_factor
        hidden = config.hidden_size
        self.router = torch.nn.Module()
        self.router.weight = Parameter(torch.empty(num_experts, hidden, dtype=torch.float32))
        self.router.register_buffer("e_score_correction_bias", torch.zeros(num_experts, dtype=torch.float32))
        width = latent_size or hidden
        self.experts = KernelMoEExperts(num_experts, width, intermediate_size, config.params_dtype, gated)
        self.activation = "silu" if gated else "relu2"
        if latent_size is not None:

            def proj(n_in, n_out):
                return build_module(latent_proj, n_in, n_out, config=config, bias=latent_bias)

            self.fc1_latent_proj, self.fc2_latent_proj = proj(hidden, latent_size), proj(latent_size, hidden)
        else:
            self.fc1_latent_proj = self.fc2_latent_proj = None
        self.shared_experts = build_module(shared_experts, config=config)

    def forward(self, hidden_states: torch.Tensor, **_unused):
        kern = self.slot.kernels
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = kern.linear(x.float(), self.router.weight.float())
        weights, ids = kern.moe_route(
            logits, self.top_k, scoring="sigmoid", norm_topk_prob=self.norm_topk_prob,
            correction_bias=self.router.e_score_correction_bias, n_group=self.n_group,
            topk_group=self.topk_group, routed_scaling_factor=self.scaling,
        )  # fmt: skip
        routed_in = x if self.fc1_latent_proj is None else self.fc1_latent_proj(x)[0]
        gate, up, down = self.experts.weights(x.dtype)
        routed = kern.moe_experts(routed_in, weights, ids, gate, up, down, activation=self.activation)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed)[0]
        shared, _ = self.shared_experts(x)
        return (routed + shared).reshape(hidden_states.shape), None
