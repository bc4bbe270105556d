"""The project's ``ModelConfig`` as a Megatron ``TransformerConfig``.

Every setting that would let Megatron compute something itself is off: no fused kernels (bias
dropout add, bias activation, RoPE, masked softmax, gradient accumulation), no dropout, no
Megatron RoPE (``position_embedding_type="none"``: the spec'd core attention rotates q/k with the
KernelSet's ``rope``), no sequence parallelism. Weights are allocated on the CPU and not
initialised: the learner loads them from HF-named tensors (``weights.py``).
"""

from __future__ import annotations

import warnings

import torch

from ...models.causal_lm import check_tp_degree
from ...models.config import ModelConfig

#: families with a Megatron layer spec here (``specs.py``); the rest get one clear error
SPEC_FAMILIES = ("qwen3", "qwen3_moe", "deepseek_v3", "nemotron_h")


class NoMegatronSpecError(ValueError):
    """A model family this integration has no Megatron layer spec for."""


def check_megatron_model(config: ModelConfig, tp_size: int) -> None:
    """Everything about ``config`` and the TP degree that the Megatron learner cannot build, each
    as one ValueError naming it (before megatron-core is imported)."""
    if config.family not in SPEC_FAMILIES:
        raise NoMegatronSpecError(
            f"no Megatron spec for family {config.family!r} (Megatron specs exist for: "
            f"{', '.join(SPEC_FAMILIES)}); use trainer='zeromismatch'"
        )
    if config.attention_bias:
        raise NoMegatronSpecError(
            f"no Megatron spec for a {config.family} model with attention_bias=true (Megatron puts a "
            "bias on every linear or on none; use trainer='zeromismatch')"
        )
    if config.family == "deepseek_v3" and config.n_shared_experts == 0:
        raise NoMegatronSpecError(
            "no Megatron spec for a deepseek_v3 model with n_shared_experts=0 (the spec's shared-expert "
            "MLP needs a nonzero width; use trainer='zeromismatch')"
        )
    if config.family == "nemotron_h" and (config.mlp_bias or config.use_bias):
        raise NoMegatronSpecError(
            "no Megatron spec for a nemotron_h model with mlp_bias or use_bias true (the spec's "
            "linears have no bias; use trainer='zeromismatch')"
        )
    check_tp_degree(config, tp_size, "Megatron tensor-parallel degree")
    if config.vocab_size % tp_size:
        raise ValueError(
            f"Megatron tensor-parallel degree {tp_size} must divide the model's vocab_size="
            f"{config.vocab_size} (the embedding and the output layer are split by vocabulary)"
        )


def rl_config_problems(rl_config) -> list[tuple[str, str]]:
    """``(field, why)`` for each setting of an ``RLConfig`` with ``trainer="megatron"`` that this
    learner cannot run (checked when the config is validated, before any model is built)."""
    from ...models import preset_dict, resolve_config

    problems: list[tuple[str, str]] = []
    try:
        model = resolve_config({**preset_dict(rl_config.model), **rl_config.model_overrides})
    except ValueError:
        return problems  # a bad preset or override is reported where the model is built
    try:
        check_megatron_model(model, 1)
    except ValueError as err:
        problems.append(("model", str(err)))
    return problems


def transformer_config(config: ModelConfig, dtype: torch.dtype, tp_size: int):
    """The ``TransformerConfig`` of ``config`` at tensor-parallel degree ``tp_size``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    ffn = config.intermediate_size or config.moe_intermediate_size
    with warnings.catch_warnings():  # its deprecation notice about the default CUDA-graph scope
        warnings.simplefilter("ignore")
        return _config(TransformerConfig, config, dtype, tp_size, ffn)


def _config(TransformerConfig, config: ModelConfig, dtype: torch.dtype, tp_size: int, ffn: int):
    import torch.nn.functional as F

    nemotron = config.family == "nemotron_h"
    return TransformerConfig(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=config.num_key_value_heads,
        kv_channels=config.head_dim,
        ffn_hidden_size=ffn,
        normalization="RMSNorm",
        layernorm_epsilon=config.rms_norm_eps,
        gated_linear_unit=not nemotron,  # Nemotron-H's MLPs are relu2, ungated
        activation_func=F.silu,  # (not called: the spec'd MLPs call the KernelSet's activation)
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=not nemotron,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        sequence_parallel=False,
        tensor_model_parallel_size=tp_size,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        init_method_std=config.initializer_range,
    )
