"""Edge cases a review found in the model package: Nemotron-H never ties its LM head (as in
transformers), a tied model refuses a checkpoint head that is not its embedding, config defaults
follow transformers' config classes (or the field is required), group-limited MoE routing is
fully validated, and DeepSeek-V3 runs without shared experts.

Logit comparisons with transformers use the fp32 tolerance of test_hf_parity.py (1e-4; measured
about 5e-7); everything else is exact.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import random_sequences, trainer_logits

from zeromismatch.models import PRESETS, ModelConfig, build_model, load_pretrained, save_pretrained
from zeromismatch.models.presets import preset_dict

transformers = pytest.importorskip("transformers")

FP32_LOGIT_TOLERANCE = 1e-4


def _hf_model(config: dict, seed: int = 0):
    config = dict(config)
    model_type = config.pop("model_type")
    config.pop("architectures")
    torch.manual_seed(seed)
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    return transformers.AutoModelForCausalLM.from_config(hf_config).eval()


def _hf_logits(hf_model, sequences):
    with torch.no_grad():
        return torch.cat([hf_model(seq[None]).logits[0] for seq in sequences])


# ---- Nemotron-H and tie_word_embeddings ------------------------------------------------------


def test_transformers_nemotron_h_never_ties():
    """The premise of the Nemotron-H rule, checked against the installed transformers."""
    assert transformers.NemotronHForCausalLM._tied_weights_keys == {}
    hf_model = _hf_model(dict(PRESETS["tiny-nemotron-h"], tie_word_embeddings=True))
    assert hf_model.lm_head.weight.data_ptr() != hf_model.model.embeddings.weight.data_ptr()


def test_tied_nemotron_h_checkpoint_from_transformers_keeps_its_head(tmp_path):
    config = dict(PRESETS["tiny-nemotron-h"], tie_word_embeddings=True)
    hf_model = _hf_model(config)
    hf_model.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, kernels="aligned")
    assert torch.equal(ours.lm_head_weight, hf_model.lm_head.weight.detach())
    assert not torch.equal(ours.lm_head_weight, ours.embedding.weight)
    sequences = random_sequences([11, 5], ours.config.vocab_size, seed=4)
    with torch.no_grad():
        diff = (trainer_logits(ours, sequences) - _hf_logits(hf_model, sequences)).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE


def test_tied_nemotron_h_checkpoint_we_save_loads_in_transformers(tmp_path):
    ours = build_model(dict(PRESETS["tiny-nemotron-h"], tie_word_embeddings=True), seed=1)
    assert ours.config.tie_word_embeddings  # kept in the config, written back unchanged
    save_pretrained(ours, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(hf_model.lm_head.weight.detach(), ours.lm_head_weight)
    sequences = random_sequences([9], ours.config.vocab_size, seed=5)
    with torch.no_grad():
        diff = (trainer_logits(ours, sequences) - _hf_logits(hf_model, sequences)).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3"])
def test_tied_model_refuses_a_checkpoint_head_that_is_not_the_embedding(preset):
    config = dict(PRESETS[preset], tie_word_embeddings=True)
    source = build_model(config, seed=2).state_dict_hf()
    embedding_name = "model.embed_tokens.weight"
    target = build_model(config, seed=3)
    # a head equal to the embedding is redundant and accepted
    target.load_state_dict_hf(dict(source, **{"lm_head.weight": source[embedding_name].clone()}))
    assert torch.equal(target.lm_head_weight, source[embedding_name])
    different = source[embedding_name].clone()
    different[0, 0] += 1.0
    with pytest.raises(ValueError, match=r"tie_word_embeddings is true but tensor 'lm_head.weight' differs"):
        build_model(config, seed=3).load_state_dict_hf(dict(source, **{"lm_head.weight": different}))


# ---- config defaults follow transformers -------------------------------------------------------

_MINIMAL = {
    "qwen3": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=256,
    ),
    "qwen3_moe": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=256, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=64,
    ),
    "deepseek_v3": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=256, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=64, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
        qk_rope_head_dim=32, v_head_dim=64, n_group=2, topk_group=1,
    ),
    "nemotron_h": dict(
        vocab_size=512, hidden_size=128, hybrid_override_pattern="M*-E", num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
        mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=64,
    ),
}  # fmt: skip
_DEFAULTED = [
    "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_bias",
    "norm_topk_prob", "decoder_sparse_step", "n_shared_experts", "routed_scaling_factor",
    "first_k_dense_replace", "rope_interleave", "n_group", "topk_group", "n_groups", "conv_kernel",
    "chunk_size", "time_step_min", "use_conv_bias", "use_bias", "mlp_bias",
]  # fmt: skip


@pytest.mark.parametrize("family", sorted(_MINIMAL))
def test_omitted_fields_take_transformers_defaults(family):
    raw = _MINIMAL[family]
    hf = transformers.AutoConfig.for_model(family, **raw)
    ours = ModelConfig.from_hf_config(dict(raw, model_type=family))
    compared = []
    for name in _DEFAULTED:
        if name in raw or not hasattr(hf, name):
            continue
        hf_name = "layer_norm_epsilon" if (family, name) == ("nemotron_h", "rms_norm_eps") else name
        assert getattr(ours, name) == getattr(hf, hf_name), f"{family}.{name}"
        compared.append(name)
    if family == "qwen3_moe":  # no head_dim field: its attention falls back to hidden / heads
        assert ours.head_dim == 128 // 4
    assert compared  # not vacuous


def test_the_defaults_that_used_to_differ():
    qwen3 = ModelConfig.from_hf_config(dict(_MINIMAL["qwen3"], model_type="qwen3"))
    assert (qwen3.head_dim, qwen3.max_position_embeddings) == (128, 32768)
    deepseek = ModelConfig.from_hf_config(dict(_MINIMAL["deepseek_v3"], model_type="deepseek_v3"))
    assert (deepseek.routed_scaling_factor, deepseek.first_k_dense_replace) == (2.5, 3)


@pytest.mark.parametrize(
    ("family", "hf_default"), [("qwen3", 32), ("qwen3_moe", 4), ("deepseek_v3", 128), ("nemotron_h", 8)]
)
def test_missing_num_key_value_heads_is_required(family, hf_default):
    raw = dict(_MINIMAL[family], model_type=family)
    del raw["num_key_value_heads"]
    message = rf"missing field 'num_key_value_heads' .*defaults it to {hf_default}"
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(raw)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_null_num_key_value_heads_means_num_attention_heads(family):
    raw = dict(_MINIMAL[family], num_key_value_heads=None)
    assert transformers.AutoConfig.for_model(family, **raw).num_key_value_heads == 4
    assert ModelConfig.from_hf_config(dict(raw, model_type=family)).num_key_value_heads == 4


@pytest.mark.parametrize("family", ["qwen3_moe", "nemotron_h"])
def test_null_num_key_value_heads_is_rejected_where_transformers_rejects_it(family):
    raw = dict(_MINIMAL[family], num_key_value_heads=None)
    with pytest.raises(Exception, match="num_key_value_heads"):  # huggingface_hub's strict validation
        transformers.AutoConfig.for_model(family, **raw)
    with pytest.raises(ValueError, match=r"'num_key_value_heads' must be a positive integer, got None"):
        ModelConfig.from_hf_config(dict(raw, model_type=family))


@pytest.mark.parametrize(("field", "hf_default"), [("n_group", 8), ("topk_group", 4)])
def test_deepseek_routing_groups_are_required(field, hf_default):
    raw = dict(_MINIMAL["deepseek_v3"], model_type="deepseek_v3")
    del raw[field]
    with pytest.raises(ValueError, match=rf"missing field '{field}' .*defaults it to {hf_default}"):
        ModelConfig.from_hf_config(raw)


def test_presets_spell_out_every_changed_default():
    """The committed runs' configs name each field whose default changed, so no bit moves (the
    Nemotron-H preset omits max_position_embeddings, whose default, 4096, did not change)."""
    changed = {
        "tiny-qwen3": {"num_key_value_heads", "head_dim", "max_position_embeddings"},
        "tiny-qwen3-moe": {"num_key_value_heads", "max_position_embeddings"},
        "tiny-deepseek-v3": {
            "num_key_value_heads", "max_position_embeddings", "routed_scaling_factor", "n_group",
            "topk_group", "first_k_dense_replace",
        },
        "tiny-nemotron-h": {"num_key_value_heads"},
    }  # fmt: skip
    for preset, names in changed.items():
        assert names <= set(PRESETS[preset]), preset


# ---- group-limited routing ---------------------------------------------------------------------

_GROUP_CASES = [
    ("tiny-deepseek-v3", {"n_group": 3}, r"n_group=3 does not divide the 8 routed experts"),
    ("tiny-deepseek-v3", {"n_group": 2, "topk_group": 3}, r"topk_group=3 exceeds n_group=2"),
    (
        "tiny-deepseek-v3",
        {"n_group": 4, "topk_group": 1, "num_experts_per_tok": 3},
        r"num_experts_per_tok=3 exceeds the 2 experts of the topk_group=1 kept groups",
    ),
    ("tiny-nemotron-h", {"n_group": 3}, r"n_group=3 does not divide the 4 routed experts"),
    ("tiny-nemotron-h", {"n_group": 2, "topk_group": 3}, r"topk_group=3 exceeds n_group=2"),
    (
        "tiny-nemotron-h",
        {"n_group": 2, "topk_group": 1, "num_experts_per_tok": 3},
        r"num_experts_per_tok=3 exceeds the 2 experts of the topk_group=1 kept groups",
    ),
]


@pytest.mark.parametrize(("preset", "change", "message"), _GROUP_CASES)
def test_bad_expert_groups_are_named(preset, change, message):
    data = dict(preset_dict(preset), **change)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(data)


@pytest.mark.parametrize(("preset", "n_group"), [("tiny-deepseek-v3", 8), ("tiny-nemotron-h", 4)])
def test_groups_of_one_expert_are_rejected(preset, n_group):
    data = dict(preset_dict(preset), n_group=n_group, topk_group=2)
    with pytest.raises(ValueError, match=rf"n_group={n_group} leaves 1 expert per group"):
        ModelConfig.from_hf_config(data)


def test_nemotron_h_groups_are_not_checked_without_moe_layers():
    data = dict(preset_dict("tiny-nemotron-h"), hybrid_override_pattern="M*M-", num_hidden_layers=4)
    data.update(n_group=3, topk_group=5)
    assert ModelConfig.from_hf_config(data).layer_pattern == "M*M-"


# ---- DeepSeek-V3 without shared experts ------------------------------------------------------------


@pytest.mark.parametrize("kernels", ["aligned", "default"])
def test_deepseek_without_shared_experts_runs_and_adds_nothing(kernels):
    """n_shared_experts=0: the zero-width shared MLP keeps its (empty) tensors and contributes
    exactly what a shared MLP of zero weights would, i.e. nothing."""
    no_shared = build_model(dict(PRESETS["tiny-deepseek-v3"], n_shared_experts=0), kernels=kernels, seed=0)
    shapes = no_shared.hf_tensor_shapes()
    assert shapes["model.layers.1.mlp.shared_experts.gate_proj.weight"] == (0, 128)
    assert shapes["model.layers.1.mlp.shared_experts.down_proj.weight"] == (128, 0)
    zero_shared = build_model(PRESETS["tiny-deepseek-v3"], kernels=kernels, seed=0)
    state = no_shared.state_dict_hf()
    for name, shape in zero_shared.hf_tensor_shapes().items():
        if ".shared_experts." in name and name.startswith("model.layers.") and ".mlp." in name:
            state[name] = torch.zeros(shape)
    zero_shared.load_state_dict_hf(state)
    sequences = random_sequences([7, 3], 512, seed=1)
    with torch.no_grad():
        assert torch.equal(trainer_logits(no_shared, sequences), trainer_logits(zero_shared, sequences))


# transformers initialises the zero-width shared MLP and warns that this is a no-op
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
def test_deepseek_without_shared_experts_matches_transformers(tmp_path):
    hf_model = _hf_model(dict(PRESETS["tiny-deepseek-v3"], n_shared_experts=0))
    hf_model.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, kernels="aligned")
    sequences = random_sequences([6, 3], 512, seed=1)
    with torch.no_grad():
        diff = (trainer_logits(ours, sequences) - _hf_logits(hf_model, sequences)).abs().max().item()
    assert diff <= FP32_LOGIT_TOLERANCE
