"""Model configuration read from (and written back to) a Hugging Face ``config.json``.

One ``ModelConfig`` covers the four supported families; which fields matter depends on
``family``:

- ``qwen3``        Qwen3ForCausalLM (dense GQA + q/k RMSNorm + SwiGLU)
- ``qwen3_moe``    Qwen3MoeForCausalLM (Qwen3 attention + softmax-routed SwiGLU experts)
- ``deepseek_v3``  DeepseekV3ForCausalLM (MLA with q/kv low rank, sigmoid group-limited routing,
                   shared + routed experts, first ``first_k_dense_replace`` layers dense)
- ``nemotron_h``   NemotronHForCausalLM (Mamba2 / attention / relu2 MLP / MoE blocks in the order
                   of ``hybrid_override_pattern``: M = Mamba2, * = attention, - = MLP, E = MoE)

Field names are Hugging Face's (transformers 5.x ``Qwen3Config``, ``Qwen3MoeConfig``,
``DeepseekV3Config``, ``NemotronHConfig``); both the v5 spelling (``rope_parameters``,
``layers_block_type``, ``num_local_experts``) and the spelling real checkpoints use
(``rope_theta`` + ``rope_scaling``, ``hybrid_override_pattern``, ``num_experts``) are read.
Structural fields without which the architecture is undefined are required. A field the
family's transformers config class defaults takes that class's default (per family: e.g.
Qwen3 ``head_dim`` 128, DeepSeek-V3 ``routed_scaling_factor`` 2.5 and ``first_k_dense_replace``
3), except where that default cannot describe a small model -- ``num_key_value_heads``
(transformers: 32 / 4 / 128 / 8) and DeepSeek-V3's ``n_group`` / ``topk_group`` (8 / 4) --
which are required, the error naming transformers' default; an explicit ``null``
``num_key_value_heads`` means ``num_attention_heads`` where transformers reads it so (Qwen3,
DeepSeek-V3). Keys we do not interpret are kept in ``extra`` and written back unchanged by
``to_hf_dict``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "NemotronHForCausalLM": "nemotron_h",
}
FAMILY_ARCHITECTURE = {family: arch for arch, family in ARCHITECTURES.items()}
PATTERN_TO_BLOCK = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
BLOCK_TO_PATTERN = {block: char for char, block in PATTERN_TO_BLOCK.items()}


@dataclass
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # rope_parameters other than rope_theta, when rope_type != default
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    # mixture of experts (qwen3_moe, deepseek_v3, nemotron_h)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # deepseek_v3
    first_k_dense_replace: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    # nemotron_h
    layer_pattern: str = ""
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    n_groups: int = 1
    conv_kernel: int = 4
    use_conv_bias: bool = True
    use_bias: bool = False
    mlp_bias: bool = False
    mlp_hidden_act: str = "relu2"
    time_step_min: float = 0.001
    chunk_size: int = 128
    moe_shared_expert_intermediate_size: int = 0
    moe_latent_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- derived -------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return FAMILY_ARCHITECTURE[self.family]

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_intermediate_size + 2 * self.n_groups * self.ssm_state_size

    def layer_kinds(self) -> list[str]:
        """Per layer: (mixer, ffn) for transformer families, or the Nemotron-H block type."""
        if self.family == "nemotron_h":
            return [PATTERN_TO_BLOCK[c] for c in self.layer_pattern]
        kinds = []
        for i in range(self.num_hidden_layers):
            if self.family == "qwen3":
                kinds.append("dense")
            elif self.family == "qwen3_moe":
                sparse = (
                    i not in self.mlp_only_layers
                    and self.num_experts > 0
                    and (i + 1) % self.decoder_sparse_step == 0
                )
                kinds.append("moe" if sparse else "dense")
            else:
                kinds.append("moe" if i >= self.first_k_dense_replace else "dense")
        return kinds

    # ---- (de)serialisation -----------------------------------------------------
    @classmethod
    def from_hf_config(cls, path_or_dict: str | os.PathLike | dict) -> ModelConfig:
        """Parse a HF config: a dict, a config.json path, or a directory holding one."""
        if isinstance(path_or_dict, dict):
            return _parse(dict(path_or_dict), "config dict")
        if not isinstance(path_or_dict, (str, os.PathLike)):
            raise TypeError(f"from_hf_config takes a dict or a path, got {type(path_or_dict).__name__}")
        path = Path(path_or_dict)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"{path}: config.json not found")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        return _parse(raw, str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json dict (HF field names) that ``from_hf_config`` reads back to ``self``."""
        out: dict[str, Any] = dict(self.extra)
        out["architectures"] = [self.architecture]
        out["model_type"] = self.family
        for name in _COMMON:
            out[name] = getattr(self, name)
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        rope.update(self.rope_scaling or {})
        if self.family != "nemotron_h":
            out["rope_parameters"] = rope
            for name in ("rms_norm_eps", "intermediate_size", "attention_bias", "hidden_act"):
                out[name] = getattr(self, name)
        if self.family in ("qwen3_moe",):
            out.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        if self.family == "deepseek_v3":
            for name in _DEEPSEEK:
                out[name] = getattr(self, name)
            out["n_routed_experts"] = self.num_experts
        if self.family == "nemotron_h":
            for name in _NEMOTRON:
                out[name] = getattr(self, name)
            out["hybrid_override_pattern"] = self.layer_pattern
            out["layer_norm_epsilon"] = self.rms_norm_eps
            out["n_routed_experts"] = self.num_experts
            out["intermediate_size"] = self.intermediate_size
            out["rope_theta"] = self.rope_theta
        return out

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed, re-validated through the HF dict."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return ModelConfig.from_hf_config(ModelConfig(**data).to_hf_dict())


_COMMON = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "max_position_embeddings",
    "initializer_range",
)
_DEEPSEEK = (
    "moe_intermediate_size",
    "num_experts_per_tok",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "first_k_dense_replace",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rope_interleave",
)
_NEMOTRON = (
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
    "use_conv_bias",
    "use_bias",
    "mlp_bias",
    "mlp_hidden_act",
    "time_step_min",
    "chunk_size",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "moe_shared_expert_intermediate_size",
    "moe_latent_size",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "attention_bias",
)
# transformers' defaults for fields that are required here (see the module docstring)
_HF_KV_HEADS_DEFAULT = {"qwen3": 32, "qwen3_moe": 4, "deepseek_v3": 128, "nemotron_h": 8}
# families whose transformers config maps an explicit null num_key_value_heads to num_attention_heads
# (Qwen3MoeConfig and NemotronHConfig type it ``int`` and reject null)
_KV_HEADS_NULL_MEANS_HEADS = ("qwen3", "deepseek_v3")
_HF_MAX_POSITIONS_DEFAULT = {"qwen3": 32768, "qwen3_moe": 32768, "deepseek_v3": 4096, "nemotron_h": 4096}
# keys that are derived or v5-only spellings; re-derived on write, so not kept in ``extra``
_CONSUMED_ALIASES = {
    "architectures",
    "model_type",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "num_local_experts",
    "layers_block_type",
    "qk_head_dim",
    "mamba_n_groups",
    "mamba_d_conv",
    "mamba_chunk_size",
    "mamba_dt_min",
    "mamba_conv_bias",
    "attention_head_dim",
    "dtype",  # storage dtype, written by save_pretrained from the model itself
    "torch_dtype",
}


def _parse(raw: dict[str, Any], source: str) -> ModelConfig:
    family = _detect_family(raw, source)
    reader = _Reader(raw, source)
    known = {f.name for f in fields(ModelConfig)}
    values: dict[str, Any] = {"family": family}

    values["vocab_size"] = reader.positive_int("vocab_size")
    values["hidden_size"] = reader.positive_int("hidden_size")
    values["num_attention_heads"] = reader.positive_int("num_attention_heads")
    values["num_key_value_heads"] = _read_kv_heads(reader, raw, family, values["num_attention_heads"])
    values["tie_word_embeddings"] = reader.boolean("tie_word_embeddings", default=False)
    values["attention_bias"] = reader.boolean("attention_bias", default=False)
    values["max_position_embeddings"] = reader.positive_int(
        "max_position_embeddings", default=_HF_MAX_POSITIONS_DEFAULT[family]
    )
    values["initializer_range"] = reader.number("initializer_range", default=0.02)
    values["rope_theta"], values["rope_scaling"] = _read_rope(raw, source)

    if family == "nemotron_h":
        _parse_nemotron(reader, raw, values)
    else:
        values["num_hidden_layers"] = reader.positive_int("num_hidden_layers")
        values["intermediate_size"] = reader.positive_int("intermediate_size")
        values["rms_norm_eps"] = reader.number("rms_norm_eps", default=1e-6)
        values["hidden_act"] = reader.choice("hidden_act", ("silu",), default="silu")
        # Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has no head_dim field and its
        # attention falls back to hidden_size // num_attention_heads
        if family == "qwen3":
            default_head_dim = 128
        else:
            default_head_dim = values["hidden_size"] // values["num_attention_heads"]
        values["head_dim"] = reader.positive_int("head_dim", default=default_head_dim)
        if raw.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported (full attention only)")
    if family == "qwen3_moe":
        values["num_experts"] = reader.positive_int(("num_experts", "num_local_experts"))
        values["num_experts_per_tok"] = reader.positive_int("num_experts_per_tok")
        values["moe_intermediate_size"] = reader.positive_int("moe_intermediate_size")
        values["norm_topk_prob"] = reader.boolean("norm_topk_prob", default=False)
        values["decoder_sparse_step"] = reader.positive_int("decoder_sparse_step", default=1)
        values["mlp_only_layers"] = list(raw.get("mlp_only_layers") or [])
    if family == "deepseek_v3":
        _parse_deepseek(reader, raw, values)

    values["extra"] = {k: v for k, v in raw.items() if k not in known and k not in _CONSUMED_ALIASES}
    for name in ("rms_norm_eps", "layer_norm_epsilon", "n_routed_experts", "hybrid_override_pattern"):
        values["extra"].pop(name, None)
    config = ModelConfig(**values)
    _check_consistency(config, source)
    return config


def _read_kv_heads(reader: _Reader, raw: dict[str, Any], family: str, num_heads: int) -> int:
    if "num_key_value_heads" not in raw:
        raise ValueError(
            f"{reader.source}: missing field 'num_key_value_heads' (transformers' {family} config "
            f"defaults it to {_HF_KV_HEADS_DEFAULT[family]}; state it explicitly)"
        )
    if raw["num_key_value_heads"] is None:
        if family in _KV_HEADS_NULL_MEANS_HEADS:
            return num_heads
        raise ValueError(f"{reader.source}: field 'num_key_value_heads' must be a positive integer, got None")
    return reader.positive_int("num_key_value_heads")


def _detect_family(raw: dict[str, Any], source: str) -> str:
    model_type = raw.get("model_type")
    archs = raw.get("architectures") or []
    if model_type in FAMILY_ARCHITECTURE:
        return model_type
    for arch in archs if isinstance(archs, list) else []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if model_type is None and not archs:
        raise ValueError(f"{source}: missing field 'model_type' (and 'architectures')")
    raise ValueError(
        f"{source}: unsupported architecture {archs!r} (model_type {model_type!r}); "
        f"supported: {', '.join(sorted(ARCHITECTURES))}"
    )


def _read_rope(raw: dict[str, Any], source: str) -> tuple[float, dict | None]:
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise ValueError(f"{source}: field 'rope_parameters' must be an object, got {params!r}")
    params = dict(params)
    theta = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"{source}: field 'rope_theta' must be a positive number, got {theta!r}")
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return float(theta), None
    return float(theta), params


def _parse_deepseek(reader: _Reader, raw: dict[str, Any], values: dict[str, Any]) -> None:
    values["num_experts"] = reader.positive_int(("n_routed_experts", "num_local_experts"))
    values["num_experts_per_tok"] = reader.positive_int("num_experts_per_tok")
    values["moe_intermediate_size"] = reader.positive_int("moe_intermediate_size")
    values["n_shared_experts"] = reader.nonneg_int("n_shared_experts", default=1)
    values["routed_scaling_factor"] = reader.number("routed_scaling_factor", default=2.5)
    for name, hf_default in (("n_group", 8), ("topk_group", 4)):
        if raw.get(name) is None:
            raise ValueError(
                f"{reader.source}: missing field {name!r} (transformers' DeepseekV3Config defaults it "
                f"to {hf_default}, which needs many more experts than a small model has; state it explicitly)"
            )
        values[name] = reader.positive_int(name)
    values["norm_topk_prob"] = reader.boolean("norm_topk_prob", default=True)
    values["first_k_dense_replace"] = reader.nonneg_int("first_k_dense_replace", default=3)
    if "q_lora_rank" not in raw:
        raise ValueError(f"{reader.source}: missing field 'q_lora_rank' (use null for a full-rank q_proj)")
    values["q_lora_rank"] = None if raw["q_lora_rank"] is None else reader.positive_int("q_lora_rank")
    values["kv_lora_rank"] = reader.positive_int("kv_lora_rank")
    values["qk_nope_head_dim"] = reader.positive_int("qk_nope_head_dim")
    values["qk_rope_head_dim"] = reader.positive_int("qk_rope_head_dim")
    values["v_head_dim"] = reader.positive_int("v_head_dim")
    values["rope_interleave"] = reader.boolean("rope_interleave", default=True)
    values["head_dim"] = values["qk_rope_head_dim"]
    topk_method = raw.get("topk_method", "noaux_tc")
    scoring = raw.get("scoring_func", "sigmoid")
    if topk_method != "noaux_tc" or scoring != "sigmoid":
        raise ValueError(
            f"{reader.source}: unsupported DeepSeek routing topk_method={topk_method!r} "
            f"scoring_func={scoring!r} (only noaux_tc + sigmoid, as DeepSeek-V3)"
        )


def _parse_nemotron(reader: _Reader, raw: dict[str, Any], values: dict[str, Any]) -> None:
    if "hybrid_override_pattern" in raw:
        pattern = raw["hybrid_override_pattern"]
        if not isinstance(pattern, str) or not pattern or set(pattern) - set(PATTERN_TO_BLOCK):
            raise ValueError(
                f"{reader.source}: field 'hybrid_override_pattern' must be a non-empty string of "
                f"M/*/-/E, got {pattern!r}"
            )
    elif "layers_block_type" in raw:
        blocks = raw["layers_block_type"]
        if not isinstance(blocks, list) or not blocks or any(b not in BLOCK_TO_PATTERN for b in blocks):
            raise ValueError(f"{reader.source}: field 'layers_block_type' is invalid: {blocks!r}")
        pattern = "".join(BLOCK_TO_PATTERN[b] for b in blocks)
    else:
        raise ValueError(f"{reader.source}: missing field 'hybrid_override_pattern' (or 'layers_block_type')")
    values["layer_pattern"] = pattern
    declared = raw.get("num_hidden_layers")
    if declared is not None and declared != len(pattern):
        raise ValueError(
            f"{reader.source}: num_hidden_layers={declared} but hybrid_override_pattern "
            f"has {len(pattern)} layers"
        )
    values["num_hidden_layers"] = len(pattern)
    values["rms_norm_eps"] = reader.number("layer_norm_epsilon", default=1e-5)
    values["use_bias"] = reader.boolean("use_bias", default=False)
    values["mlp_bias"] = reader.boolean("mlp_bias", default=False)
    values["mlp_hidden_act"] = reader.choice("mlp_hidden_act", ("relu2",), default="relu2")
    values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if "M" in pattern:
        values["mamba_num_heads"] = reader.positive_int("mamba_num_heads")
        values["mamba_head_dim"] = reader.positive_int("mamba_head_dim")
        values["ssm_state_size"] = reader.positive_int("ssm_state_size")
        values["n_groups"] = reader.positive_int(("n_groups", "mamba_n_groups"), default=8)
        values["conv_kernel"] = reader.positive_int(("conv_kernel", "mamba_d_conv"), default=4)
        values["use_conv_bias"] = reader.boolean(("use_conv_bias", "mamba_conv_bias"), default=True)
        values["time_step_min"] = reader.number(("time_step_min", "mamba_dt_min"), default=0.001)
        values["chunk_size"] = reader.positive_int(("chunk_size", "mamba_chunk_size"), default=128)
        reader.choice("mamba_hidden_act", ("silu",), default="silu")
    if "*" in pattern:
        values["head_dim"] = reader.positive_int(("head_dim", "attention_head_dim"))
    if "-" in pattern:
        values["intermediate_size"] = reader.positive_int("intermediate_size")
    if "E" in pattern:
        values["num_experts"] = reader.positive_int(("n_routed_experts", "num_local_experts"))
        values["num_experts_per_tok"] = reader.positive_int("num_experts_per_tok")
        values["moe_intermediate_size"] = reader.positive_int("moe_intermediate_size")
        values["moe_shared_expert_intermediate_size"] = reader.positive_int(
            "moe_shared_expert_intermediate_size"
        )
        values["n_shared_experts"] = reader.nonneg_int("n_shared_experts", default=1)
        values["routed_scaling_factor"] = reader.number("routed_scaling_factor", default=1.0)
        values["n_group"] = reader.positive_int("n_group", default=1)
        values["topk_group"] = reader.positive_int("topk_group", default=1)
        values["norm_topk_prob"] = reader.boolean("norm_topk_prob", default=True)
        latent = raw.get("moe_latent_size")
        values["moe_latent_size"] = None if latent is None else reader.positive_int("moe_latent_size")


def _check_consistency(config: ModelConfig, source: str) -> None:
    def bad(msg: str) -> ValueError:
        return ValueError(f"{source}: {msg}")

    if config.num_attention_heads % config.num_key_value_heads:
        raise bad(
            f"num_attention_heads={config.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={config.num_key_value_heads}"
        )
    if config.num_experts and config.num_experts_per_tok > config.num_experts:
        raise bad(f"num_experts_per_tok={config.num_experts_per_tok} exceeds {config.num_experts} experts")
    grouped_routing = config.family == "deepseek_v3" or (
        config.family == "nemotron_h" and "E" in config.layer_pattern
    )
    if grouped_routing:
        _check_expert_groups(config, bad)
    if config.family == "deepseek_v3":
        if config.qk_rope_head_dim % 2:
            raise bad(f"qk_rope_head_dim={config.qk_rope_head_dim} must be even")
    if config.family == "nemotron_h" and "M" in config.layer_pattern:
        if config.mamba_num_heads % config.n_groups:
            raise bad(
                f"mamba_num_heads={config.mamba_num_heads} is not a multiple of n_groups={config.n_groups}"
            )
    if config.family in ("qwen3", "qwen3_moe") and config.head_dim % 2:
        raise bad(f"head_dim={config.head_dim} must be even for rotary embeddings")


def _check_expert_groups(config: ModelConfig, bad) -> None:
    """Group-limited routing (DeepSeek-V3, Nemotron-H): experts split into ``n_group`` equal groups,
    each scored by the sum of its two best experts, the best ``topk_group`` groups kept, then
    ``num_experts_per_tok`` experts chosen among them -- each step needs its own condition."""
    experts, groups, kept, top_k = (
        config.num_experts,
        config.n_group,
        config.topk_group,
        config.num_experts_per_tok,
    )
    if experts % groups:
        raise bad(f"n_group={groups} does not divide the {experts} routed experts")
    per_group = experts // groups
    if per_group < 2:
        raise bad(
            f"n_group={groups} leaves {per_group} expert per group; group scores sum each group's "
            "two best experts, so every group needs at least 2"
        )
    if kept > groups:
        raise bad(f"topk_group={kept} exceeds n_group={groups}")
    if top_k > kept * per_group:
        raise bad(
            f"num_experts_per_tok={top_k} exceeds the {kept * per_group} experts of the "
            f"topk_group={kept} kept groups ({per_group} experts each)"
        )


class _Reader:
    """Typed access to raw config fields; every failure names the source and the field."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    _MISSING = object()

    def _get(self, names, default):
        names = (names,) if isinstance(names, str) else names
        for name in names:
            if name in self.raw and self.raw[name] is not None:
                return names[0], self.raw[name]
        if default is self._MISSING:
            raise ValueError(f"{self.source}: missing field {names[0]!r}")
        return names[0], default

    def positive_int(self, names, default=_MISSING) -> int:
        name, value = self._get(names, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{self.source}: field {name!r} must be a positive integer, got {value!r}")
        return value

    def nonneg_int(self, names, default=_MISSING) -> int:
        name, value = self._get(names, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{self.source}: field {name!r} must be a non-negative integer, got {value!r}")
        return value

    def number(self, names, default=_MISSING) -> float:
        name, value = self._get(names, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{self.source}: field {name!r} must be a finite number, got {value!r}")
        return float(value)

    def boolean(self, names, default=_MISSING) -> bool:
        name, value = self._get(names, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.source}: field {name!r} must be true or false, got {value!r}")
        return value

    def choice(self, names, allowed: tuple[str, ...], default=_MISSING) -> str:
        name, value = self._get(names, default)
        if value not in allowed:
            raise ValueError(
                f"{self.source}: field {name!r}={value!r} is not supported (supported: {allowed})"
            )
        return value
