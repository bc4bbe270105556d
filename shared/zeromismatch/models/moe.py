"""Mixture-of-experts blocks and the Qwen3-MoE model.

- ``Router``: router logits by ``kernels.linear`` (in fp32 for sigmoid routers, as DeepSeek-V3 /
  Nemotron-H compute them; in the activation dtype for Qwen3-MoE's softmax router), then
  ``kernels.moe_route`` (deterministic top-k, ties to the lower expert id).
- ``Experts``: routed experts stored stacked (``[E, I, H]`` / ``[E, H, I]``) and run by
  ``kernels.moe_experts``; in the HF state dict they appear per expert
  (``experts.{e}.gate_proj.weight`` ...), the layout real checkpoints use.
- ``SparseMoeBlock``: Qwen3-MoE (routed only). ``SharedRoutedMoe``: DeepSeek-V3 / Nemotron-H
  (routed + shared experts; Nemotron-H's optional latent projections).

Routed experts are replicated across tensor-parallel ranks (see tp.py); shared experts are a
regular column/row-parallel MLP.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.base import QuantizedWeight
from .config import ModelConfig
from .dense import TransformerCausalLM, qwen3_attention
from .layers import DecoderLayer, ForwardContext, GatedMLP, Linear, Relu2MLP
from .tp import TensorParallel


class Router(nn.Module):
    def __init__(self, config: ModelConfig, scoring: str):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.scoring = scoring
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.keep_fp32 = scoring == "sigmoid"
        if scoring == "sigmoid":
            # DeepSeek-V3 / Nemotron-H: selection-only bias, kept in fp32 like transformers does
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))
            self.n_group, self.topk_group = config.n_group, config.topk_group
            self.routed_scaling_factor = config.routed_scaling_factor
        else:
            self.e_score_correction_bias = None
            self.n_group = self.topk_group = 1
            self.routed_scaling_factor = 1.0

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        kern = ctx.kernels
        if self.scoring == "sigmoid":
            logits = kern.linear(x.float(), self.weight.float())
        else:
            logits = kern.linear(x, self.weight.to(x.dtype))
        return kern.moe_route(
            logits,
            self.top_k,
            scoring=self.scoring,
            norm_topk_prob=self.norm_topk_prob,
            correction_bias=self.e_score_correction_bias,
            n_group=self.n_group,
            topk_group=self.topk_group,
            routed_scaling_factor=self.routed_scaling_factor,
        )


class Experts(nn.Module):
    """Routed experts, stacked. ``gate_proj`` is None for Nemotron-H's non-gated relu2 experts."""

    def __init__(self, num_experts: int, input_size: int, intermediate_size: int, gated: bool):
        super().__init__()
        self.num_experts = num_experts
        shape_in = (num_experts, intermediate_size, input_size)
        self.gate_proj = nn.Parameter(torch.empty(shape_in)) if gated else None
        self.up_proj = nn.Parameter(torch.empty(shape_in))
        self.down_proj = nn.Parameter(torch.empty(num_experts, input_size, intermediate_size))
        self.activation = "silu" if gated else "relu2"
        # set by quantize_model: per projection, one QuantizedWeight per expert
        self.quantized: dict[str, list[QuantizedWeight]] | None = None
        self.dequantize = None
        # set by fake_quantize_model: per projection, a FakeQuantizer of the stacked master weight
        self.fake_quant: dict | None = None

    def projection_names(self) -> list[str]:
        return [
            n
            for n in ("gate_proj", "up_proj", "down_proj")
            if getattr(self, n) is not None or (self.quantized is not None and n in self.quantized)
        ]

    def _weights(self) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        if self.fake_quant is not None:
            # each expert as dequantize(quantize(w), fp32), stacked: the quantized branch's bits
            fake, gate = self.fake_quant, self.gate_proj
            return (
                None if gate is None else fake["gate_proj"](gate, torch.float32),
                fake["up_proj"](self.up_proj, torch.float32),
                fake["down_proj"](self.down_proj, torch.float32),
            )
        if self.quantized is None:
            return self.gate_proj, self.up_proj, self.down_proj
        # the MoE kernel contract takes dense weights: quantized experts run as
        # dequantize(quantize(w)), the same bits on the rollout and the trainer side
        dense = {name: torch.stack([self.dequantize(q) for q in qs]) for name, qs in self.quantized.items()}
        return dense.get("gate_proj"), dense["up_proj"], dense["down_proj"]

    def forward(self, x, topk_weights, topk_ids, ctx: ForwardContext) -> torch.Tensor:
        gate, up, down = self._weights()
        dtype = x.dtype
        gate = None if gate is None else gate.to(dtype)
        return ctx.kernels.moe_experts(
            x, topk_weights, topk_ids, gate, up.to(dtype), down.to(dtype), activation=self.activation
        )


class SparseMoeBlock(nn.Module):
    """Qwen3-MoE: softmax router + SwiGLU routed experts (no shared expert)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate = Router(config, "softmax")
        self.experts = Experts(
            config.num_experts, config.hidden_size, config.moe_intermediate_size, gated=True
        )

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        weights, ids = self.gate(x, ctx)
        return self.experts(x, weights, ids, ctx)


class SharedRoutedMoe(nn.Module):
    """DeepSeek-V3 (SwiGLU experts) or Nemotron-H (relu2 experts, optional latent projection):
    ``routed(x) + shared(x)``."""

    def __init__(self, config: ModelConfig, tp: TensorParallel, nemotron: bool):
        super().__init__()
        self.gate = Router(config, "sigmoid")
        if nemotron:
            latent = config.moe_latent_size
            input_size = latent or config.hidden_size
            self.experts = Experts(config.num_experts, input_size, config.moe_intermediate_size, gated=False)
            self.shared_experts = Relu2MLP(
                config.hidden_size, config.moe_shared_expert_intermediate_size, config.mlp_bias, tp
            )
            self.shared_width = config.moe_shared_expert_intermediate_size
            if latent is not None:
                self.fc1_latent_proj = Linear(config.hidden_size, latent, config.mlp_bias, "replicated", tp)
                self.fc2_latent_proj = Linear(latent, config.hidden_size, config.mlp_bias, "replicated", tp)
            else:
                self.fc1_latent_proj = self.fc2_latent_proj = None
        else:
            self.experts = Experts(
                config.num_experts, config.hidden_size, config.moe_intermediate_size, gated=True
            )
            shared = config.moe_intermediate_size * config.n_shared_experts
            # n_shared_experts=0 keeps the zero-width MLP (its [0, H] / [H, 0] tensors are in
            # transformers' checkpoints) but forward skips it: it contributes exactly zero, and
            # kernels need a reduction length >= 1
            self.shared_experts = GatedMLP(config.hidden_size, shared, tp)
            self.shared_width = shared
            self.fc1_latent_proj = self.fc2_latent_proj = None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        weights, ids = self.gate(x, ctx)
        routed_in = x if self.fc1_latent_proj is None else self.fc1_latent_proj(x, ctx.kernels)
        routed = self.experts(routed_in, weights, ids, ctx)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed, ctx.kernels)
        if self.shared_width == 0:
            return routed
        return routed + self.shared_experts(x, ctx)


class Qwen3MoeForCausalLM(TransformerCausalLM):
    family = "qwen3_moe"

    def build_layers(self) -> None:
        config, tp = self.config, self.tp
        layers = []
        for kind in config.layer_kinds():
            mlp = (
                SparseMoeBlock(config)
                if kind == "moe"
                else GatedMLP(config.hidden_size, config.intermediate_size, tp)
            )
            layers.append(
                DecoderLayer(qwen3_attention(config, tp), mlp, config.hidden_size, config.rms_norm_eps)
            )
        self._setup(layers)
