"""Layer specs: Megatron's ``TransformerLayer`` / ``SelfAttention`` / ``MLP`` structure with the
KernelSet modules of ``layers.py``, ``attention.py`` and ``mlp.py`` in every numeric slot.

``block_spec(model_config, slot)`` is the whole decoder of a ``GPTModel`` family (Qwen3, Qwen3-MoE,
DeepSeek-V3): one layer spec per layer and the final norm (``TransformerBlockSubmodules(layer_norm=...)``);
``nemotron_h_stack_spec`` is Nemotron-H's ``MambaStack`` spec. ``stock_local_block_spec`` is Megatron's own
local spec (``get_gpt_layer_local_spec``: torch ops, Megatron's RoPE and attention) on the same
parameters, the comparison that shows what the kernel specs change.
"""

from __future__ import annotations

import warnings

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
from .layers import (
    KernelColumnParallelLinear,
    KernelReplicatedLinear,
    KernelRMSNorm,
    KernelRowParallelLinear,
    KernelSlot,
)
from .mlp import KernelGatedMLP


def _with(module, slot: KernelSlot, **params) -> ModuleSpec:
    return ModuleSpec(module=module, params={"kernels": slot, **params})


def self_attention_spec(slot: KernelSlot, inv_freq, qk_norm: bool) -> ModuleSpec:
    """Causal GQA self-attention on the kernels: RoPE with ``inv_freq`` (None: no positional rotation,
    Nemotron-H's attention layers), q/k RMSNorm per head when ``qk_norm``."""
    norm = _with(KernelRMSNorm, slot, per_head_shard=True) if qk_norm else None
    extra = {"q_layernorm": norm, "k_layernorm": norm} if qk_norm else {}
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=_with(KernelColumnParallelLinear, slot),
            core_attention=_with(KernelCoreAttention, slot, inv_freq=inv_freq),
            linear_proj=_with(KernelRowParallelLinear, slot),
            **extra,
        ),
    )


def qwen3_attention_spec(config: ModelConfig, slot: KernelSlot) -> ModuleSpec:
    """GQA self-attention with q/k RMSNorm and rotate-half RoPE (Qwen3, Qwen3-MoE)."""
    inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling, config.family)
    return self_attention_spec(slot, inv_freq, qk_norm=True)


def gated_mlp_spec(slot: KernelSlot, ffn_hidden_size: int) -> ModuleSpec:
    """SwiGLU MLP; its width and TP group are spec params (Megatron's layer passes them only to the
    MLP classes it knows)."""
    from megatron.core import parallel_state

    return ModuleSpec(
        module=KernelGatedMLP,
        params={
            "kernels": slot,
            "ffn_hidden_size": ffn_hidden_size,
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


def mla_attention_spec(config: ModelConfig, slot: KernelSlot) -> ModuleSpec:
    """DeepSeek-V3 MLA (``mla.py``) with Megatron's MLA submodule names."""
    with warnings.catch_warnings():  # the module's import of a deprecated TE shim warns
        warnings.simplefilter("ignore", DeprecationWarning)
        from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules

    from ...models.mla import _LOW_RANK_NORM_EPS
    from .mla import KernelMLASelfAttention

    inv_freq = rope_inv_freq(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling, config.family)
    dims = {k: getattr(config, k) for k in (
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank")}  # fmt: skip
    column, replicated = _with(KernelColumnParallelLinear, slot), _with(KernelReplicatedLinear, slot)
    norm = _with(KernelRMSNorm, slot)
    return ModuleSpec(
        module=KernelMLASelfAttention,
        params={
            "kernels": slot,
            "dims": dims,
            "inv_freq": inv_freq,
            "low_rank_eps": _LOW_RANK_NORM_EPS,
            "rope_interleave": bool(config.rope_interleave),
        },  # fmt: skip
        submodules=MLASelfAttentionSubmodules(
            linear_q_proj=column,
            linear_q_down_proj=replicated,
            linear_q_up_proj=column,
            linear_kv_down_proj=replicated,
            linear_kv_up_proj=column,
            q_layernorm=norm,
            kv_layernorm=norm,
            linear_proj=_with(KernelRowParallelLinear, slot),
        ),  # fmt: skip
    )


def shared_routed_moe_spec(config: ModelConfig, slot: KernelSlot, shared: ModuleSpec, **nemotron):
    """DeepSeek-V3's (SwiGLU) or Nemotron-H's (relu2, ``nemotron``: gated=False and the latent
    projection) routed + shared experts (``moe.KernelSharedRoutedMoE``) in the MLP slot."""
    from .moe import KernelSharedRoutedMoE

    return _with(
        KernelSharedRoutedMoE, slot, num_experts=config.num_experts, top_k=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size, norm_topk_prob=config.norm_topk_prob,
        n_group=config.n_group, topk_group=config.topk_group,
        routed_scaling_factor=config.routed_scaling_factor, shared_experts=shared,
        **({"gated": True} | nemotron),
    )  # fmt: skip


def relu2_mlp_spec(slot: KernelSlot, ffn_hidden_size: int) -> ModuleSpec:
    """Nemotron-H's ungated relu2 MLP (``mlp.KernelRelu2MLP``)."""
    from .mlp import KernelRelu2MLP

    spec = gated_mlp_spec(slot, ffn_hidden_size)
    return ModuleSpec(module=KernelRelu2MLP, params=spec.params, submodules=spec.submodules)


def nemotron_h_stack_spec(config: ModelConfig, slot: KernelSlot) -> ModuleSpec:
    """Nemotron-H's decoder: Megatron's ``MambaStack`` (``hybrid.KernelMambaStack``) with a layer spec
    per pattern symbol: ``M`` a ``MambaLayer`` around ``hybrid.KernelMamba2Mixer``, ``*`` a
    ``TransformerLayer`` with attention only (GQA, no RoPE, no q/k norm), ``-`` and ``E`` an
    ``MLPLayer`` with the relu2 MLP / the shared + routed relu2 experts; each block pre-norm."""
    from megatron.core.ssm.mamba_block import MambaStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer

    from .hybrid import KernelMamba2Mixer, KernelMambaStack

    norm, replicated = _with(KernelRMSNorm, slot), _with(KernelReplicatedLinear, slot)
    dims = {k: getattr(config, k) for k in (
        "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "mamba_intermediate_size",
        "mamba_conv_dim", "conv_kernel", "use_conv_bias", "time_step_min")}  # fmt: skip
    mixer = _with(
        KernelMamba2Mixer, slot, dims={**dims, "eps": config.rms_norm_eps}, replicated_linear=replicated
    )
    attention = self_attention_spec(slot, inv_freq=None, qk_norm=False)
    moe = shared_routed_moe_spec(
        config, slot, relu2_mlp_spec(slot, config.moe_shared_expert_intermediate_size), gated=False,
        latent_size=config.moe_latent_size, latent_proj=replicated, latent_bias=config.mlp_bias,
    )  # fmt: skip

    def mlp_layer(mlp: ModuleSpec) -> ModuleSpec:
        return ModuleSpec(
            module=MLPLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=norm, mlp=mlp, mlp_bda=get_bias_dropout_add
            ),
        )

    return ModuleSpec(
        module=KernelMambaStack,
        params={"kernels": slot},
        submodules=MambaStackSubmodules(
            mamba_layer=ModuleSpec(
                module=MambaLayer,
                submodules=MambaLayerSubmodules(
                    norm=_with(KernelRMSNorm, slot, eps=config.rms_norm_eps),
                    mixer=mixer,
                    mamba_bda=get_bias_dropout_add,
                ),  # fmt: skip
            ),
            attention_layer=ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=norm, self_attention=attention, self_attn_bda=get_bias_dropout_add
                ),
            ),
            mlp_layer=mlp_layer(relu2_mlp_spec(slot, config.intermediate_size)),
            moe_layer=mlp_layer(moe),
        ),
    )


def block_spec(config: ModelConfig, slot: KernelSlot) -> TransformerBlockSubmodules:
    """The decoder of ``config``'s family: its layer specs (dense or MoE per layer, as
    ``ModelConfig.layer_kinds`` says) and the final norm."""
    if config.family not in ("qwen3", "qwen3_moe", "deepseek_v3"):  # check_megatron_model refused it
        raise ValueError(f"no Megatron spec for family {config.family!r}")
    mlps = {"dense": gated_mlp_spec(slot, config.intermediate_size)}
    if config.family == "deepseek_v3":
        attention = mla_attention_spec(config, slot)
        shared = gated_mlp_spec(slot, config.moe_intermediate_size * config.n_shared_experts)
        mlps["moe"] = shared_routed_moe_spec(config, slot, shared)
    else:
        attention = qwen3_attention_spec(config, slot)
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
