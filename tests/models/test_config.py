"""ModelConfig: HF config.json in and out, presets, and one clear error per bad config."""

from __future__ import annotations

import json

import pytest
from model_helpers import hf_model_from_preset

from zeromismatch.models import PRESETS, TINY_PRESETS, ModelConfig, build_model
from zeromismatch.models.presets import preset_dict

FULL_SIZE = ["qwen3-0.6b", "qwen3-4b", "qwen3-30b-a3b", "deepseek-v3", "nemotron-h-8b"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_parse_and_round_trip(preset):
    config = ModelConfig.from_hf_config(preset_dict(preset))
    assert ModelConfig.from_hf_config(config.to_hf_dict()) == config
    assert config.num_hidden_layers == len(config.layer_kinds())


def test_full_size_presets_describe_the_published_shapes():
    qwen4b = ModelConfig.from_hf_config(PRESETS["qwen3-4b"])
    assert (qwen4b.hidden_size, qwen4b.num_hidden_layers, qwen4b.tie_word_embeddings) == (2560, 36, True)
    qwen06b = ModelConfig.from_hf_config(PRESETS["qwen3-0.6b"])
    assert (qwen06b.hidden_size, qwen06b.num_hidden_layers, qwen06b.intermediate_size) == (1024, 28, 3072)
    moe = ModelConfig.from_hf_config(PRESETS["qwen3-30b-a3b"])
    assert (moe.num_experts, moe.num_experts_per_tok, moe.layer_kinds().count("moe")) == (128, 8, 48)
    ds = ModelConfig.from_hf_config(PRESETS["deepseek-v3"])
    assert ds.layer_kinds()[:4] == ["dense", "dense", "dense", "moe"] and ds.qk_head_dim == 192
    assert ds.rope_scaling["rope_type"] == "yarn"
    nh = ModelConfig.from_hf_config(PRESETS["nemotron-h-8b"])
    kinds = nh.layer_kinds()
    assert (len(kinds), kinds.count("linear_attention"), kinds.count("full_attention")) == (52, 24, 4)


def test_full_size_yarn_config_is_representable_but_not_buildable():
    with pytest.raises(ValueError, match="yarn"):
        build_model("deepseek-v3")


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_presets_are_tiny(preset):
    config = ModelConfig.from_hf_config(PRESETS[preset])
    assert config.hidden_size <= 256 and config.num_hidden_layers <= 5 and config.vocab_size <= 1024
    assert (config.qk_head_dim if config.family == "deepseek_v3" else config.head_dim) == 64


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_reads_transformers_config_json(tmp_path, preset):
    """transformers 5.x writes v5 spellings (rope_parameters, layers_block_type, num_local_experts)."""
    hf_model_from_preset(preset).config.save_pretrained(tmp_path)
    assert ModelConfig.from_hf_config(tmp_path) == ModelConfig.from_hf_config(PRESETS[preset]).replace(
        extra=ModelConfig.from_hf_config(tmp_path).extra
    )


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_to_hf_dict_is_read_by_transformers(preset):
    transformers = pytest.importorskip("transformers")
    ours = ModelConfig.from_hf_config(PRESETS[preset])
    data = ours.to_hf_dict()
    hf = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    assert hf.hidden_size == ours.hidden_size and hf.vocab_size == ours.vocab_size
    assert hf.num_hidden_layers == ours.num_hidden_layers


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(ValueError, match=r"config\.json: unsupported architecture \['LlamaForCausalLM'\]"):
        ModelConfig.from_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("preset", "field"),
    [
        ("tiny-qwen3", "hidden_size"),
        ("tiny-qwen3", "num_hidden_layers"),
        ("tiny-qwen3-moe", "num_experts"),
        ("tiny-deepseek-v3", "kv_lora_rank"),
        ("tiny-deepseek-v3", "q_lora_rank"),
        ("tiny-nemotron-h", "hybrid_override_pattern"),
        ("tiny-nemotron-h", "mamba_num_heads"),
        ("tiny-nemotron-h", "head_dim"),
    ],
)
def test_missing_field_is_named(tmp_path, preset, field):
    data = preset_dict(preset)
    del data[field]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"config\.json: missing field '{field}'"):
        ModelConfig.from_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": -4}, "'hidden_size' must be a positive integer"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
        ({"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern"),
        ({"num_hidden_layers": 9}, "num_hidden_layers=9 but hybrid_override_pattern has 5"),
        (
            {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True},
            "sliding",
        ),
        ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_bad_field_values_are_named(change, message):
    data = preset_dict("tiny-nemotron-h" if "model_type" not in change else "tiny-qwen3")
    data.update(change)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(data)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ValueError, match="config.json not found"):
        ModelConfig.from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        ModelConfig.from_hf_config(tmp_path)
    with pytest.raises(TypeError):
        ModelConfig.from_hf_config(42)
