"""Layer specs: Megatron's ``TransformerLayer`` / ``SelfAttention`` / ``MLP`` structure with the
KernelSet modules of ``layers.py``, ``attention.py`` and ``mlp.py`` in every numeric slot.

``block_spec(model_config, slot)`` is the whole decoder: one layer spec per layer and the final
norm (``TransformerBlockSubmodules(layer_norm=...)``). ``stock_local_block_spec`` is Megatron's own
local spec (``get_gpt_layer_local_spec``: torch ops, Megatron's RoPE and attention) on the same
parameters, the comparison that shows what the kernel specs change.
"""

from __future__ import annotations

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from ...models.config import ModelConfig
from ...models.layers import rope_inv_freq
from .attention import KernelCoreAttention
from .layers import KernelColumnParallelLinear, KernelRMSNorm, KernelRowParallelLinear, KernelSlot
from .mlp import KernelGatedMLP


def _with(module, slot: KernelSlot, **params) -> ModuleSpec:
    return ModuleSpec(module=module, params={"kernels": slot, **params})


def qwen3_attention_spec(config: ModelConfig, slot: KernelSlot) -> ModuleSpec:
    """GQA self-attention with q/k RMSNorm and rotate-half RoPE (Qwen3, Qwen3-MoE)."""
    inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling, config.family)
    norm = _with(KernelRMSNorm, slot, per_head_shard=True)
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=_with(KernelColumnParallelLinear, slot),
            core_attention=_with(KernelCoreAttention, slot, inv_freq=inv_freq),
            linear_proj=_with(KernelRowParallelLinear, slot),
            q_layernorm=norm,
            k_layernorm=norm,
        ),
    )


def gated_mlp_spec(slot: KernelSlot, ffn_hidden_size: int) -> ModuleSpec:
    """SwiGLU MLP; its width and TP group are spec params (Megatron's layer passes them only to the
    MLP classes it knows)."""
    from megatron.core import parallel_state

    return ModuleSpec(
        module=KernelGatedMLP,
        params={
            "kernels": slot, "ffn_hidden_size": ffn_hidden_size,
            "tp_group": parallel_state.get_tensor_model_parallel_group(),
        },  # fmt: skip
        submodules=MLPSubmodules(
            linear_fc1=_with(KernelColumnParallelLinear, slot),
            linear_fc2=_with(KernelRowParallelLinear, slot),
        ),
    )


def transformer_layer_spec(self_attention: ModuleSpec, mlp: ModuleSpec, slot: KernelSlot) -> ModuleSpec:
    """Pre-norm layer: ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (Megatron's bias-dropout-add,
    with no bias and dropout 0, is the plain residual add)."""
    norm = _with(KernelRMSNorm, slot)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=self_attention,
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
        ),
    )


def softmax_moe_spec(config: ModelConfig, slot: KernelSlot) -> ModuleSpec:
    """Qwen3-MoE's routed experts (``moe.py``) in the MLP slot."""
    from .moe import KernelSoftmaxMoE

    return _with(
        KernelSoftmaxMoE, slot, num_experts=config.num_experts, top_k=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size, norm_topk_prob=config.norm_topk_prob,
    )  # fmt: skip


def block_spec(config: ModelConfig, slot: KernelSlot) -> TransformerBlockSubmodules:
    """The decoder of ``config``'s family: its layer specs (Qwen3-MoE: dense or MoE per layer, as
    ``ModelConfig.layer_kinds`` says) and the final norm."""
    if config.family not in ("qwen3", "qwen3_moe"):  # config.check_megatron_model refused it already
        raise ValueError(f"no Megatron spec for family {config.family!r}")
    attention = qwen3_attention_spec(config, slot)
    mlps = {"dense": gated_mlp_spec(slot, config.intermediate_size)}
    if config.family == "qwen3_moe":
        mlps["moe"] = softmax_moe_spec(config, slot)
    layers = [transformer_layer_spec(attention, mlps[kind], slot) for kind in config.layer_kinds()]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=_with(KernelRMSNorm, slot))


def stock_local_block_spec(config: ModelConfig) -> TransformerBlockSubmodules:
    """Megatron's own local spec (torch norms, linears, RoPE and attention) for a dense Qwen3."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    layer = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    return TransformerBlockSubmodules(
        layer_specs=[layer] * config.num_hidden_layers, layer_norm=WrappedTorchNorm
    )
