"""Megatron's ``MLP`` with its activation on the KernelSet.

Megatron's gated MLP stacks ``[gate; up]`` in one column-parallel ``linear_fc1`` (per TP rank:
this rank's slice of gate, then of up) and splits the output in halves; the activation here is
``kernels.silu_mul(gate, up)`` (SwiGLU), as in the project's ``GatedMLP``, whose fused gate/up GEMM
is the same product. ``linear_fc2`` is the row-parallel down projection.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.mlp import MLP

from .layers import KernelSlot


class KernelGatedMLP(MLP):
    """``down(silu(gate(x)) * up(x))`` with Megatron's fc1/fc2 and ``kernels.silu_mul``."""

    def __init__(self, *args, kernels: KernelSlot, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.config.gated_linear_unit:
            raise ValueError("KernelGatedMLP needs config.gated_linear_unit=True")
        self.slot = kernels

    def forward(self, hidden_states: torch.Tensor, per_token_scale=None, **kwargs):
        if per_token_scale is not None:
            raise ValueError("KernelGatedMLP has no per-token scale (it is not an expert)")
        gate_up, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            raise ValueError("KernelGatedMLP has no fc1 bias")
        gate, up = torch.chunk(gate_up, 2, dim=-1)
        return self.linear_fc2(self.slot.kernels.silu_mul(gate, up))
