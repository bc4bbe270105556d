"""Megatron's ``MLP`` with its activation on the KernelSet.

Megatron's gated MLP stacks ``[gate; up]`` in one column-parallel ``linear_fc1`` (per TP rank:
this rank's slice of gate, then of up) and splits the output in halves; the activation here is
``kernels.silu_mul(gate, up)`` (SwiGLU), as in the project's ``GatedMLP``, whose fused gate/up GEMM
is the same product (``KernelRelu2MLP``: Nemotron-H's ungated ``kernels.relu2``). ``linear_fc2``
is the row-parallel down projection, sized by the spec's ``ffn_hidden_size`` (Megatron's ``MLP``
sizes it by the config's, so a narrower MLP rebuilds it).
"""

from __future__ import annotations

import torch
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.spec_utils import build_module

from .layers import KernelSlot


class KernelGatedMLP(MLP):
    """``down(silu(gate(x)) * up(x))`` with Megatron's fc1/fc2 and ``kernels.silu_mul``."""

    gated = True

    def __init__(self, config, submodules, *args, kernels: KernelSlot, ffn_hidden_size=None, tp_group=None,
                 **kwargs):  # fmt: skip
        kwargs.update(ffn_hidden_size=ffn_hidden_size, tp_group=tp_group)
        super().__init__(config, submodules, *args, **kwargs)
        if self.config.gated_linear_unit != self.gated:
            raise ValueError(f"{type(self).__name__} needs config.gated_linear_unit={self.gated}")
        self.slot = kernels
        if ffn_hidden_size is not None and ffn_hidden_size != config.ffn_hidden_size:
            # Megatron's MLP sizes linear_fc2 by config.ffn_hidden_size whatever ffn_hidden_size it was
            # given (0.16.1); a narrower MLP (DeepSeek-V3's shared experts) gets its own fc2
            self.linear_fc2 = build_module(
                submodules.linear_fc2, ffn_hidden_size, config.hidden_size, config=config,
                init_method=config.output_layer_init_method, bias=config.add_bias_linear,
                input_is_parallel=True, skip_bias_add=True, is_expert=False, tp_group=tp_group,
            )  # fmt: skip

    def forward(self, hidden_states: torch.Tensor, per_token_scale=None, **kwargs):
        if per_token_scale is not None:
            raise ValueError("KernelGatedMLP has no per-token scale (it is not an expert)")
        gate_up, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            raise ValueError("KernelGatedMLP has no fc1 bias")
        gate, up = torch.chunk(gate_up, 2, dim=-1)
        return self.linear_fc2(self.slot.kernels.silu_mul(gate, up))


class KernelRelu2MLP(KernelGatedMLP):
    """Nemotron-H's ``down(relu(up(x))^2)`` (no gate: ``config.gated_linear_unit=False``) on
    ``kernels.relu2``: its MLP layers and its shared expert."""

    gated = False

    def forward(self, hidden_states: torch.Tensor, per_token_scale=None, **kwargs):
        if per_token_scale is not None:
            raise ValueError("KernelRelu2MLP has no per-token scale (it is not an expert)")
        up, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            raise ValueError("KernelRelu2MLP has no fc1 bias")
        return self.linear_fc2(self.slot.kernels.relu2(up))
