"""safetensors checkpoints: bitwise save -> load round trip, and one clear error per bad input."""

from __future__ import annotations

import json

import pytest
import torch
from reference_kernels import ReferenceKernels
from safetensors.torch import load_file, save_file

from zeromismatch.models import TINY_PRESETS, build_model, load_pretrained, save_pretrained
from zeromismatch.models.loader import WEIGHTS_NAME


def _saved(tmp_path, preset="tiny-qwen3", dtype=torch.float32):
    model = build_model(preset, kernels=ReferenceKernels(), dtype=dtype, seed=5)
    save_pretrained(model, tmp_path)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_round_trip_is_bitwise(tmp_path, preset, dtype):
    model = _saved(tmp_path, preset, dtype)
    loaded = load_pretrained(tmp_path, kernels=ReferenceKernels(), dtype=dtype)
    assert loaded.config == model.config
    before, after = model.state_dict_hf(), loaded.state_dict_hf()
    assert before.keys() == after.keys()
    for name in before:
        assert before[name].dtype == after[name].dtype, name
        assert torch.equal(before[name], after[name]), name
    # a second save writes the same bytes
    save_pretrained(loaded, tmp_path / "again")
    assert (tmp_path / "again" / WEIGHTS_NAME).read_bytes() == (tmp_path / WEIGHTS_NAME).read_bytes()


def test_sigmoid_routers_stay_fp32_in_bf16(tmp_path):
    model = build_model("tiny-deepseek-v3", kernels=ReferenceKernels(), dtype=torch.bfloat16)
    sd = model.state_dict_hf()
    assert sd["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    assert sd["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert sd["model.layers.1.mlp.experts.0.up_proj.weight"].dtype == torch.bfloat16


def test_seeded_init_is_deterministic_and_seed_dependent():
    a = build_model("tiny-qwen3-moe", kernels=ReferenceKernels(), seed=1).state_dict_hf()
    b = build_model("tiny-qwen3-moe", kernels=ReferenceKernels(), seed=1).state_dict_hf()
    c = build_model("tiny-qwen3-moe", kernels=ReferenceKernels(), seed=2).state_dict_hf()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"]
    )


def _rewrite(tmp_path, edit):
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    edit(tensors)
    save_file(tensors, tmp_path / WEIGHTS_NAME)


def test_missing_tensor_is_named(tmp_path):
    _saved(tmp_path)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


def test_wrong_shape_is_named(tmp_path):
    _saved(tmp_path)

    def edit(t):
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 128)

    _rewrite(tmp_path, edit)
    with pytest.raises(
        ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(64, 128\)"
    ):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


def test_unexpected_tensor_is_named(tmp_path):
    _saved(tmp_path)

    def edit(t):
        t["model.layers.0.mlp.surprise.weight"] = torch.zeros(2)

    _rewrite(tmp_path, edit)
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.surprise\.weight'"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weight_is_named(tmp_path, bad_value):
    _saved(tmp_path)

    def edit(t):
        t["model.norm.weight"][7] = bad_value

    _rewrite(tmp_path, edit)
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' contains NaN or Inf"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


def test_integer_tensor_is_rejected(tmp_path):
    _saved(tmp_path)

    def edit(t):
        t["model.norm.weight"] = torch.ones(128, dtype=torch.int32)

    _rewrite(tmp_path, edit)
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has dtype torch\.int32"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


@pytest.mark.parametrize("keep_fraction", [0.0, 0.001, 0.5, 0.999])
def test_truncated_file_is_named(tmp_path, keep_fraction):
    _saved(tmp_path)
    path = tmp_path / WEIGHTS_NAME
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a valid safetensors file"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


def test_corrupt_header_is_named(tmp_path):
    _saved(tmp_path)
    path = tmp_path / WEIGHTS_NAME
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32  # garbage where the JSON header starts
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors: not a valid safetensors file"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())


def test_missing_weights_file_is_named(tmp_path):
    _saved(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(ValueError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        load_pretrained(tmp_path, kernels=ReferenceKernels())
    with pytest.raises(ValueError, match="checkpoint directory not found"):
        load_pretrained(tmp_path / "nowhere", kernels=ReferenceKernels())


def test_sharded_checkpoint_loads(tmp_path):
    model = _saved(tmp_path)
    tensors = load_file(tmp_path / WEIGHTS_NAME)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, tmp_path / shard)
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / WEIGHTS_NAME).unlink()
    loaded = load_pretrained(tmp_path, kernels=ReferenceKernels())
    assert all(torch.equal(v, loaded.state_dict_hf()[k]) for k, v in model.state_dict_hf().items())


def test_load_state_dict_hf_validates_before_copying():
    model = build_model("tiny-qwen3", kernels=ReferenceKernels(), seed=0)
    before = model.state_dict_hf()
    bad = dict(before)
    bad["model.norm.weight"] = torch.full((128,), float("nan"))
    with pytest.raises(ValueError, match="NaN or Inf"):
        model.load_state_dict_hf(bad)
    after = model.state_dict_hf()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_multi_token_prediction_layers_are_skipped():
    model = build_model("tiny-deepseek-v3", kernels=ReferenceKernels(), seed=0)
    sd = model.state_dict_hf()
    sd["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)  # layer index >= num_hidden_layers
    model.load_state_dict_hf(sd)
