"""HF <-> Megatron weight maps (round trips, the fused layouts, TP slicing) and the bad inputs the
Megatron learner refuses with one error naming them."""

from __future__ import annotations

import pytest
import torch
from megatron_helpers import DTYPES

from zeromismatch.integrations.megatron import NoMegatronSpecError, build_megatron_model, check_megatron_model
from zeromismatch.integrations.megatron.weights import TensorMap, family_maps
from zeromismatch.models import build_model, resolve_config

pytestmark = pytest.mark.megatron

SPEC_PRESETS = ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("preset", SPEC_PRESETS)
def test_hf_to_megatron_to_hf_is_the_same_bytes(preset, dtype):
    reference = build_model(preset, dtype=DTYPES[dtype], seed=3).state_dict_hf()
    model = build_megatron_model(preset, dtype=DTYPES[dtype], seed=None)
    model.load_state_dict_hf(reference)
    back = model.state_dict_hf()
    assert sorted(back) == sorted(reference)
    for name, tensor in reference.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert torch.equal(back[name].view(torch.uint8), tensor.view(torch.uint8)), name
    assert model.hf_tensor_shapes() == {name: tuple(t.shape) for name, t in reference.items()}


def test_fused_layouts_are_megatrons():
    # linear_qkv: per query group, its q heads, then its k and v head; linear_fc1: [gate; up]
    config = resolve_config("tiny-qwen3")
    hf = build_model(config, seed=1).state_dict_hf()
    model = build_megatron_model(config, seed=None)
    model.load_state_dict_hf(hf)
    params = dict(model.gpt.named_parameters())
    d, per_group = config.head_dim, config.num_attention_heads // config.num_key_value_heads
    qkv = params["decoder.layers.0.self_attention.linear_qkv.weight"].detach()
    q, k, v = (hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    group1 = qkv[(per_group + 2) * d : 2 * (per_group + 2) * d]
    assert torch.equal(group1[: per_group * d], q[per_group * d : 2 * per_group * d])
    assert torch.equal(group1[per_group * d : (per_group + 1) * d], k[d : 2 * d])
    assert torch.equal(group1[(per_group + 1) * d :], v[d : 2 * d])
    fc1 = params["decoder.layers.1.mlp.linear_fc1.weight"].detach()
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate, up]))


@pytest.mark.parametrize("preset", SPEC_PRESETS)
@pytest.mark.parametrize("size", [2, 4])
def test_tp_slices_reassemble_to_the_hf_tensors(size, preset):
    # each rank's slice, built alone from the full HF tensors, and put back together from all ranks
    from zeromismatch.models import preset_dict

    config = resolve_config({**preset_dict(preset), "num_key_value_heads": 4})
    hf = build_model(config, seed=2).state_dict_hf()
    for m in family_maps(config):
        sources = [hf[name] for name in m.hf]
        per_rank = [m.to_megatron(sources, rank, size) for rank in range(size)]
        for name, tensor in zip(m.hf, m.to_hf(per_rank)):
            assert torch.equal(tensor, hf[name]), (m.megatron, name)
    gate_up = TensorMap("fc1", ("gate", "up"), "gate_up")
    gate, up = torch.arange(8.0)[:, None], 100 + torch.arange(8.0)[:, None]
    rank1 = gate_up.to_megatron([gate, up], 1, 2)  # this rank's halves of gate and up (stride 2)
    assert rank1.flatten().tolist() == [4, 5, 6, 7, 104, 105, 106, 107]


def _qwen3_dict() -> dict:
    from zeromismatch.models import preset_dict

    return preset_dict("tiny-qwen3")


def test_a_checkpoint_whose_shapes_do_not_fit_the_spec_is_one_error_naming_the_tensor():
    model = build_megatron_model("tiny-qwen3", seed=1)  # initialised: empty memory can hold NaN
    state = build_model("tiny-qwen3", seed=0).state_dict_hf()
    before = {k: v.clone() for k, v in model.state_dict_hf().items()}
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(64, 128)
    expected = (r"^ckpt: tensor 'model.layers.1.self_attn.k_proj.weight' has shape \(64, 128\); "
                r"the Megatron qwen3 spec expects \(128, 128\)$")  # fmt: skip
    with pytest.raises(ValueError, match=expected):
        model.load_state_dict_hf(state, source="ckpt")
    after = model.state_dict_hf()
    assert all(torch.equal(before[k], after[k]) for k in before)  # validated before any copy
    del state["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="missing tensor 'model.layers.1.self_attn.k_proj.weight'"):
        model.load_state_dict_hf(state, source="ckpt")
    wider = build_model({**_qwen3_dict(), "intermediate_size": 384}, seed=0).state_dict_hf()
    with pytest.raises(ValueError, match="gate_proj.weight' has shape \\(384, 128\\)"):
        model.load_state_dict_hf(wider, source="ckpt")


def test_a_family_without_a_spec_is_one_error_naming_it():
    # every family of models/ has a spec; a config of another family is refused before any build
    import dataclasses

    config = dataclasses.replace(resolve_config("tiny-qwen3"), family="llama")
    with pytest.raises(NoMegatronSpecError, match="^no Megatron spec for family 'llama'"):
        build_megatron_model(config)


@pytest.mark.parametrize(
    ("preset", "overrides", "why"),
    [("tiny-deepseek-v3", {"n_shared_experts": 0}, "a deepseek_v3 model with n_shared_experts=0"),
     ("tiny-nemotron-h", {"mlp_bias": True}, "a nemotron_h model with mlp_bias or use_bias true")],
)  # fmt: skip
def test_a_variant_without_a_spec_is_one_error(preset, overrides, why):
    from zeromismatch.models import preset_dict

    config = resolve_config({**preset_dict(preset), **overrides})
    with pytest.raises(NoMegatronSpecError, match=f"^no Megatron spec for {why}"):
        build_megatron_model(config)


def test_deepseek_mtp_layers_are_skipped_on_load_as_the_project_skips_them():
    state = build_model("tiny-deepseek-v3", seed=0).state_dict_hf()
    model = build_megatron_model("tiny-deepseek-v3", seed=None)
    model.load_state_dict_hf({**state, "model.layers.3.eh_proj.weight": torch.zeros(128, 256)})
    assert all(torch.equal(model.state_dict_hf()[k], state[k]) for k in state)
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.2.extra.weight'"):
        model.load_state_dict_hf({**state, "model.layers.2.extra.weight": torch.zeros(2)})


@pytest.mark.parametrize(
    ("degree", "why"),
    [(3, "must divide the 4 virtual shards"), (4, "must divide the model's num_key_value_heads=2"),
     (0, "must be >= 1, got 0")],
)  # fmt: skip
def test_a_tp_degree_that_does_not_divide_the_model_is_one_error(degree, why):
    config = resolve_config("tiny-qwen3")
    with pytest.raises(ValueError, match=f"^Megatron tensor-parallel degree.* {why}"):
        check_megatron_model(config, degree)
    with pytest.raises(ValueError, match=why):
        build_megatron_model(config, tp_size=degree)


def test_tp_degree_must_match_the_process_group():
    # one process: degree 2 needs a 2-rank group (run_spmd / torchrun), said as such
    build_megatron_model("tiny-qwen3", seed=None)  # (this process's one-rank group, made once)
    with pytest.raises(ValueError, match="tensor-parallel degree 2 must equal the world size 1"):
        build_megatron_model("tiny-qwen3", tp_size=2)


def test_the_stock_local_spec_comparison_is_qwen3_only():
    with pytest.raises(ValueError, match="^stock_spec=True .* qwen3 only, got 'deepseek_v3'$"):
        build_megatron_model("tiny-deepseek-v3", seed=None, stock_spec=True)
