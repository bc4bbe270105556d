"""Qwen3 (dense): GQA attention with per-head q/k RMSNorm and RoPE ("rotate_half" layout),
SwiGLU MLP, pre-norm residual layers, optional tied embeddings. Mirrors transformers'
``Qwen3ForCausalLM`` module for module, with every op through the KernelSet.

Also the shared transformer body (``TransformerCausalLM``: ``model.embed_tokens`` ->
``model.layers`` -> ``model.norm`` -> ``lm_head``) that Qwen3-MoE and DeepSeek-V3 reuse.
"""

from __future__ import annotations

from torch import nn

from .causal_lm import CausalLM
from .config import ModelConfig
from .layers import Attention, DecoderLayer, Embedding, GatedMLP, RMSNorm, rope_inv_freq
from .tp import TensorParallel


class _TransformerModel(nn.Module):
    """The ``model.`` subtree of Qwen3 / Qwen3-MoE / DeepSeek-V3 checkpoints."""

    def __init__(self, config: ModelConfig, layers: list[nn.Module]):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TransformerCausalLM(CausalLM):
    """Shared body of the three transformer families: embed -> layers -> norm (-> lm_head)."""

    def _setup(self, layers: list[nn.Module]) -> None:
        self.model = _TransformerModel(self.config, layers)
        self._attach_lm_head()

    @property
    def embedding(self):
        return self.model.embed_tokens

    @property
    def decoder_layers(self):
        return self.model.layers

    @property
    def final_norm(self):
        return self.model.norm


def qwen3_attention(config: ModelConfig, tp: TensorParallel) -> Attention:
    inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling, config.family)
    return Attention(
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        tp,
        config.attention_bias,
        config.rms_norm_eps,
        inv_freq,
    )


class Qwen3ForCausalLM(TransformerCausalLM):
    family = "qwen3"

    def build_layers(self) -> None:
        config, tp = self.config, self.tp
        layers = [
            DecoderLayer(
                qwen3_attention(config, tp),
                GatedMLP(config.hidden_size, config.intermediate_size, tp),
                config.hidden_size,
                config.rms_norm_eps,
            )
            for _ in range(config.num_hidden_layers)
        ]
        self._setup(layers)
