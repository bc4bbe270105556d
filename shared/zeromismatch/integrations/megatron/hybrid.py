"""Nemotron-H on Megatron's hybrid stack, with a Mamba2 mixer of our own on the KernelSet.

megatron-core 0.16.1's ``MambaModel`` / ``MambaStack`` / ``MambaLayer`` / ``MLPLayer`` import and
build on a CPU; what does not is its mixer, ``megatron.core.ssm.mamba_mixer``: the module does not
import without ``triton`` (its inference tensor ops) and its ``MambaMixer`` raises ImportError
without ``mamba_ssm`` and ``causal_conv1d`` (CUDA/Triton kernels for the conv, the chunked scan and
the gated norm). So the stack is Megatron's, built from a ``MambaStackSubmodules`` spec (the layer
kinds allocated from ``hybrid_override_pattern`` by Megatron's ``allocate_layers``), and the mixer
slot of its ``MambaLayer`` holds ``KernelMamba2Mixer``, which computes exactly
``models.hybrid.Mamba2Mixer.forward``: ``in_proj`` (``kernels.linear``), ``kernels.causal_conv1d``
(silu), ``kernels.ssm_scan`` with ``A = -exp(A_log)``, ``kernels.gated_rms_norm``, ``out_proj``.
Its parameters keep the HF names (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``,
``out_proj``); the mixer is replicated over TP ranks, as the project's TP keeps it.

Two more replacements, both for modules Megatron builds outside any spec: the stack's final norm is
``TENorm`` (Transformer Engine, absent here), replaced by ``KernelRMSNorm``
(``KernelMambaStack``), and ``MambaModel.output_layer`` by ``KernelOutputLayer``
(``kernel_mamba_model_class``), as for the GPT model.
"""

from __future__ import annotations

import torch
from megatron.core.ssm.mamba_block import MambaStack
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module
from torch.nn import Parameter

from .attention import token_layout
from .layers import KernelOutputLayer, KernelRMSNorm, KernelSlot


class KernelMamba2Mixer(MegatronModule):
    """The ``mixer`` of a ``MambaLayer``: Nemotron-H's Mamba2 mixer on the KernelSet (module docstring)."""

    def __init__(
        self, config, d_model: int, submodules=None, layer_number: int = 1, pg_collection=None,
        pp_layer_offset: int = 0, *, kernels: KernelSlot, dims: dict, replicated_linear,
    ):  # fmt: skip
        super().__init__(config=config)
        self.slot = kernels
        self.num_heads, self.head_dim = dims["mamba_num_heads"], dims["mamba_head_dim"]
        self.n_groups, self.state_size = dims["n_groups"], dims["ssm_state_size"]
        self.intermediate, self.conv_dim = dims["mamba_intermediate_size"], dims["mamba_conv_dim"]
        self.eps, self.dt_limit = dims["eps"], (dims["time_step_min"], float("inf"))
        dtype, width = config.params_dtype, dims["conv_kernel"]
        projection = self.intermediate + self.conv_dim + self.num_heads
        self.in_proj = build_module(replicated_linear, d_model, projection, config=config)
        self.conv1d = torch.nn.Module()
        self.conv1d.weight = Parameter(torch.empty(self.conv_dim, 1, width, dtype=dtype))
        self.conv1d.bias = (
            Parameter(torch.empty(self.conv_dim, dtype=dtype)) if dims["use_conv_bias"] else None
        )
        self.dt_bias = Parameter(torch.empty(self.num_heads, dtype=dtype))
        self.A_log = Parameter(torch.empty(self.num_heads, dtype=dtype))
        self.D = Parameter(torch.empty(self.num_heads, dtype=dtype))
        self.norm = torch.nn.Module()
        self.norm.weight = Parameter(torch.empty(self.intermediate, dtype=dtype))
        self.out_proj = build_module(replicated_linear, self.intermediate, d_model, config=config)

    def forward(self, hidden_states, inference_context=None, packed_seq_params=None, **_unused):
        if inference_context is not None:
            raise ValueError("KernelMamba2Mixer has no inference mode (the rollout side is the engine)")
        x, cu, _, restore = token_layout(hidden_states, packed_seq_params)
        return restore(self._mix(x, cu)), None

    def _mix(self, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        kern, tokens, inner, conv = self.slot.kernels, x.shape[0], self.intermediate, self.conv_dim
        projected, _ = self.in_proj(x)
        gate = projected[:, :inner]
        xbc = projected[:, inner : inner + conv]
        dt = projected[:, inner + conv :]
        xbc, _ = kern.causal_conv1d(
            xbc, self.conv1d.weight[:, 0, :], self.conv1d.bias, cu, None, activation="silu"
        )
        group_width = self.n_groups * self.state_size
        xs = xbc[:, :inner].reshape(tokens, self.num_heads, self.head_dim)
        B = xbc[:, inner : inner + group_width].reshape(tokens, self.n_groups, self.state_size)
        C = xbc[:, inner + group_width :].reshape(tokens, self.n_groups, self.state_size)
        A = -torch.exp(self.A_log.float())  # a function of a parameter alone, as in models/hybrid.py
        y, _ = kern.ssm_scan(xs, dt, A, B, C, self.D, self.dt_bias, cu, None, self.dt_limit)
        y = kern.gated_rms_norm(
            y.reshape(tokens, inner), gate, self.norm.weight, self.eps, inner // self.n_groups
        )
        out, _ = self.out_proj(y.to(x.dtype))
        return out


class KernelMambaStack(MambaStack):
    """``MambaStack`` whose final norm is ``KernelRMSNorm`` (Megatron's is ``TENorm``)."""

    def __init__(
        self, config, submodules, *args, kernels: KernelSlot, post_layer_norm: bool = True, **kwargs
    ):
        super().__init__(config, submodules, *args, post_layer_norm=False, **kwargs)
        self.post_layer_norm = post_layer_norm
        if self.post_process and post_layer_norm:
            self.final_norm = KernelRMSNorm(
                config, config.hidden_size, eps=config.layernorm_epsilon, kernels=kernels
            )


def kernel_mamba_model_class():
    """``MambaModel`` with its output layer on the KernelSet (built outside any spec, replaced with
    the same shape and sharding), as ``model._kernel_gpt_class`` does for ``GPTModel``."""
    from megatron.core.models.mamba.mamba_model import MambaModel

    class KernelMambaModel(MambaModel):
        def __init__(self, config, mamba_stack_spec, *, kernel_slot, **kwargs):
            super().__init__(config, mamba_stack_spec, **kwargs)
            if self.post_process:
                self.output_layer = KernelOutputLayer.for_model(self, kernel_slot)  # never tied

    return KernelMambaModel
