"""Nemotron-H-style hybrid: a stack of pre-norm residual blocks whose mixer is chosen per layer
by ``hybrid_override_pattern`` -- ``M`` Mamba2, ``*`` attention (GQA, no RoPE, no q/k norm),
``-`` relu2 MLP, ``E`` MoE (sigmoid router, relu2 routed experts + relu2 shared expert).

Mamba2 mixer, per token: ``[z, xBC, dt] = in_proj(x)``; ``xBC = silu(causal_conv1d(xBC))``
split into ``x`` (heads x head_dim), ``B``, ``C`` (n_groups x state); the selective scan
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t h_t + D x_t`` with
``dt_t = clamp(softplus(dt + dt_bias), time_step_min)``; then the gated group RMSNorm
``norm(y * silu(z))`` and ``out_proj``. The dt clamp follows transformers' NemotronH mixer,
which uses ``(time_step_min, inf)`` on its full-sequence path.

Engine mode keeps, per sequence slot, the last ``conv_kernel - 1`` conv inputs and the fp32
SSM state ``[H, P, N]``; a sequence whose ``has_initial_state`` is False (the default for
``kv_lens == q_lens``) starts from zeros. Because that state summarises the whole prefix it
cannot be re-derived from cached K/V, so ``supports_prefix_caching`` is False.

As in transformers, the LM head is never tied to the embeddings (``tie_word_embeddings`` is
kept in the config but ignored): the model has and saves its own ``lm_head.weight``.

The only arithmetic outside the kernels is ``A = -exp(A_log)``, a function of a parameter
alone (identical bits on every side).

Rounding differences from transformers that only show below fp32: the block RMSNorms use the
KernelSet's Qwen3 order (normalise in fp32, round to the activation dtype, multiply by the
weight) where transformers' NemotronH multiplies by the weight in fp32 before rounding; and the
scan output is returned in the activation dtype before the gated norm. In fp32 both orders
are the same computation (parity with transformers is asserted in fp32).
"""

from __future__ import annotations

import torch
from torch import nn

from .causal_lm import CausalLM
from .config import ModelConfig
from .layers import Attention, Embedding, ForwardContext, Linear, Relu2MLP, RMSNorm
from .moe import SharedRoutedMoe
from .tp import TensorParallel


class _Conv1d(nn.Module):
    """Depthwise conv weights in HF's layout (``weight [C, 1, W]``)."""

    def __init__(self, channels: int, width: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None


class Mamba2Mixer(nn.Module):
    def __init__(self, config: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.num_heads, self.head_dim = config.mamba_num_heads, config.mamba_head_dim
        self.n_groups, self.state_size = config.n_groups, config.ssm_state_size
        self.intermediate = config.mamba_intermediate_size
        self.conv_dim = config.mamba_conv_dim
        self.conv_kernel = config.conv_kernel
        projection = self.intermediate + self.conv_dim + self.num_heads
        self.in_proj = Linear(config.hidden_size, projection, config.use_bias, "replicated", tp)
        self.conv1d = _Conv1d(self.conv_dim, config.conv_kernel, config.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.D = nn.Parameter(torch.empty(self.num_heads))
        self.norm = RMSNorm(self.intermediate, config.rms_norm_eps)
        self.out_proj = Linear(self.intermediate, config.hidden_size, config.use_bias, "replicated", tp)
        self.dt_limit = (config.time_step_min, float("inf"))

    def state_cache_spec(self):
        return (self.conv_dim, self.conv_kernel - 1), (self.num_heads, self.head_dim, self.state_size)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern, tokens = ctx.kernels, x.shape[0]
        cu = ctx.batch.cu_seqlens_q
        projected = self.in_proj(x, kern)
        inner, conv = self.intermediate, self.conv_dim
        gate = projected[:, :inner]
        xbc = projected[:, inner : inner + conv]
        dt = projected[:, inner + conv :]

        conv_state = ssm_state = slots = None
        if ctx.engine:
            # the kernels read each sequence's state from its cache slot (zeros if fresh) and write the
            # new one back there, in place
            conv_state, ssm_state = (
                ctx.cache.conv_state[ctx.layer_index],
                ctx.cache.ssm_state[ctx.layer_index],
            )
            per_layer = ctx.cache.state_slots
            state_slots = ctx.batch.state_slots if per_layer is None else per_layer[ctx.layer_index]
            slots = {"state_slots": state_slots, "has_initial_state": ctx.has_initial_state}

        xbc, _ = kern.causal_conv1d(
            xbc,  # (a column slice: the native conv reads its rows in place; the others copy it)
            self.conv1d.weight[:, 0, :],
            self.conv1d.bias,
            cu,
            conv_state,
            activation="silu",
            **(slots or {}),
        )
        group_width = self.n_groups * self.state_size
        xs = xbc[:, :inner].reshape(tokens, self.num_heads, self.head_dim)
        B = xbc[:, inner : inner + group_width].reshape(tokens, self.n_groups, self.state_size)
        C = xbc[:, inner + group_width :].reshape(tokens, self.n_groups, self.state_size)
        A = -torch.exp(self.A_log.float())
        y, _ = kern.ssm_scan(
            xs, dt, A, B, C, self.D, self.dt_bias, cu, ssm_state, self.dt_limit, **(slots or {})
        )
        y = kern.gated_rms_norm(
            y.reshape(tokens, inner), gate, self.norm.weight, self.norm.eps, inner // self.n_groups
        )
        return self.out_proj(y.to(x.dtype), kern)


class NemotronHBlock(nn.Module):
    def __init__(self, config: ModelConfig, kind: str, tp: TensorParallel):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if kind == "linear_attention":
            self.mixer = Mamba2Mixer(config, tp)
        elif kind == "full_attention":
            # transformers' NemotronHAttention: no bias, no RoPE, no q/k norm
            self.mixer = Attention(
                config.hidden_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                tp,
                bias=False,
                qk_norm_eps=None,
                inv_freq=None,
            )
        elif kind == "mlp":
            self.mixer = Relu2MLP(config.hidden_size, config.intermediate_size, config.mlp_bias, tp)
        else:
            self.mixer = SharedRoutedMoe(config, tp, nemotron=True)

    def kv_cache_spec(self):
        return self.mixer.kv_cache_spec() if self.kind == "full_attention" else None

    def state_cache_spec(self):
        return self.mixer.state_cache_spec() if self.kind == "linear_attention" else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return x + self.mixer(self.norm(x, ctx.kernels), ctx)


class _Backbone(nn.Module):
    def __init__(self, config: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(config, kind, tp) for kind in config.layer_kinds())
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps)


class NemotronHForCausalLM(CausalLM):
    family = "nemotron_h"
    supports_prefix_caching = False

    @property
    def ties_word_embeddings(self) -> bool:
        # transformers' NemotronHForCausalLM never ties (its _tied_weights_keys is empty): it keeps
        # and saves its own lm_head.weight whatever tie_word_embeddings says, and so do we
        return False

    def build_layers(self) -> None:
        self.backbone = _Backbone(self.config, self.tp)
        self._attach_lm_head()

    @property
    def embedding(self):
        return self.backbone.embeddings

    @property
    def decoder_layers(self):
        return self.backbone.layers

    @property
    def final_norm(self):
        return self.backbone.norm_f

    def _ignorable(self, name: str) -> bool:
        return name.startswith("mtp.") or super()._ignorable(name)
