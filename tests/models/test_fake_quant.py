"""fake_quantize_model: the learner keeps fp32 master weights and computes with their quantized value.

Checks, for every tiny preset x weight format x aligned kernel set: the fake-quantized learner's
trainer-mode logits and logprobs equal a quantize_model'd copy's (same master weights) in trainer
mode and engine mode, bit for bit, with and without autograd (inverse: the plain dense model
differs); gradients reach every quantized master and are exactly the gradient w.r.t. the
fake-quantized weight (straight-through); after optimizer steps the engine re-quantizes what
``state_dict_hf`` exports and still agrees bitwise; the no_grad cache follows in-place updates;
the same weights are (fake-)quantized as quantize_model's; bad combinations are refused.
Every preset's quantized in-dims are multiples of 16, so nvfp4 runs on all four.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import engine_logits, random_sequences, trainer_logits

from zeromismatch.kernels.aligned.gemm import clear_packed_weights
from zeromismatch.models import (
    QUANT_FORMATS,
    TINY_PRESETS,
    build_model,
    fake_quantize_model,
    preset_dict,
    quantize_model,
)
from zeromismatch.models.layers import Linear, fused_linear
from zeromismatch.models.moe import Experts, Router
from zeromismatch.models.tp import TensorParallel

PRESETS = ("tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h")
KERNELS = ["aligned", pytest.param("aligned-native", marks=pytest.mark.native)]


def _learner(preset, fmt, kernels="aligned", seed=1, dtype=torch.float32):
    return fake_quantize_model(build_model(preset, kernels=kernels, seed=seed, dtype=dtype), fmt)


def _engine_copy(learner, fmt, kernels="aligned", dtype=torch.float32):
    """The rollout side: a model loaded with the learner's exported masters, then quantized."""
    engine = build_model(learner.config, kernels=kernels, seed=0, dtype=dtype)
    engine.load_state_dict_hf(learner.state_dict_hf())
    return quantize_model(engine, fmt)


def _logprobs(model, logits, sequences):
    """Raw logprob of each next token (the last position of a sequence has none)."""
    logprobs = model.kernels.log_softmax(logits)
    picked, offset = [], 0
    for seq in sequences:
        rows = logprobs[offset : offset + seq.numel() - 1]
        picked.append(rows.gather(1, seq[1:, None]).squeeze(1))
        offset += seq.numel()
    return torch.cat(picked)


def _quantized_masters(model):
    """(name, Parameter) of every master weight fake_quantize_model covers."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.fake_quant is not None:
            out.append((f"{name}.weight", module.weight))
        elif isinstance(module, Experts) and module.fake_quant is not None:
            out += [(f"{name}.{proj}", getattr(module, proj)) for proj in module.fake_quant]
    return out


def test_every_tiny_preset_is_covered():
    assert set(PRESETS) == set(TINY_PRESETS)
    assert QUANT_FORMATS == ("fp8", "fp8-block", "nvfp4")


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("preset", PRESETS)
def test_learner_matches_quantized_engine_bitwise(preset, fmt, kernels):
    learner = _learner(preset, fmt, kernels)
    engine = _engine_copy(learner, fmt, kernels)
    sequences = random_sequences([7, 5], learner.config.vocab_size, seed=0)
    trained = trainer_logits(learner, sequences)  # autograd: recomputed through the straight-through op
    assert trained.requires_grad
    with torch.no_grad():
        cached = trainer_logits(learner, sequences)  # the packed-weight cache's fake-quantized weights
        engine_trainer = trainer_logits(engine, sequences)
        engine_engine = engine_logits(engine, sequences, [3, 1])
        plain = build_model(learner.config, kernels=kernels, seed=0)
        plain.load_state_dict_hf(learner.state_dict_hf())
        dense = trainer_logits(plain, sequences)
    for reference in (engine_trainer, engine_engine):
        assert torch.equal(trained.detach(), reference)
        assert torch.equal(cached, reference)
    learner_lp = _logprobs(learner, trained.detach(), sequences)
    assert torch.equal(learner_lp, _logprobs(engine, engine_engine, sequences))
    assert not torch.equal(cached, dense)  # inverse: the masters themselves are not what the engine uses


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-nemotron-h"])
def test_learner_matches_quantized_engine_in_bf16(preset, kernels):
    learner = _learner(preset, "nvfp4", kernels, dtype=torch.bfloat16)
    engine = _engine_copy(learner, "nvfp4", kernels, dtype=torch.bfloat16)
    sequences = random_sequences([6, 4], learner.config.vocab_size, seed=3)
    trained = trainer_logits(learner, sequences)
    with torch.no_grad():
        assert torch.equal(trained.detach(), engine_logits(engine, sequences, [2, 1]))


def _capture_fake_weights(model):
    """Wrap every FakeQuantizer so the fake-quantized weights it returns keep their gradient."""
    captured = {}

    def wrap(key, quantizer):
        def call(weight, dtype):
            out = quantizer(weight, dtype)
            out.retain_grad()
            captured.setdefault(key, []).append(out)
            return out

        return call

    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.fake_quant is not None:
            module.fake_quant = wrap(f"{name}.weight", module.fake_quant)
        elif isinstance(module, Experts) and module.fake_quant is not None:
            module.fake_quant = {p: wrap(f"{name}.{p}", q) for p, q in module.fake_quant.items()}
    return captured


def _loss(model, sequences):
    return -_logprobs(model, trainer_logits(model, sequences), sequences).sum()


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("preset", PRESETS)
def test_gradients_pass_straight_through_to_every_master(preset, fmt, kernels):
    learner = _learner(preset, fmt, kernels)
    masters = _quantized_masters(learner)
    captured = _capture_fake_weights(learner)
    _loss(learner, random_sequences([12, 9, 7], learner.config.vocab_size, seed=1)).backward()
    assert masters
    for name, master in masters:
        if master.numel() == 0:  # DeepSeek's zero-width shared expert (n_shared_experts=0): skipped
            continue
        assert master.grad is not None, name
        assert torch.isfinite(master.grad).all() and master.grad.abs().sum() > 0, name
        (fake,) = captured[name]  # used once per forward: no fused projection shares it
        assert torch.equal(master.grad, fake.grad.to(master.dtype)), name


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("fmt", QUANT_FORMATS)
@pytest.mark.parametrize("preset", PRESETS)
def test_engine_requantizes_the_trained_masters(preset, fmt, kernels):
    learner = _learner(preset, fmt, kernels)
    engine = _engine_copy(learner, fmt, kernels)
    sequences = random_sequences([8, 6], learner.config.vocab_size, seed=2)
    optimizer = torch.optim.Adam(learner.parameters(), lr=1e-3)
    before = {name: t.clone() for name, t in learner.state_dict_hf().items()}
    for _ in range(2):
        optimizer.zero_grad()
        _loss(learner, sequences).backward()
        optimizer.step()
    exported = learner.state_dict_hf()
    masters = dict(_quantized_masters(learner))
    changed = [n for n in exported if not torch.equal(exported[n], before[n])]
    assert any(n.endswith("proj.weight") for n in changed)
    for name, master in masters.items():  # state_dict_hf exports the masters unchanged
        if name.endswith(".weight"):
            assert torch.equal(exported[name], master.detach())
    with torch.no_grad():
        stale = engine_logits(engine, sequences, [3, 2])
        engine.load_state_dict_hf(exported)
        learner_now = trainer_logits(learner, sequences)
        assert not torch.equal(stale, learner_now)
        assert torch.equal(learner_now, engine_logits(engine, sequences, [3, 2]))
        assert torch.equal(learner_now, trainer_logits(engine, sequences))
    assert torch.equal(trainer_logits(learner, sequences).detach(), learner_now)


@pytest.mark.parametrize("fmt", QUANT_FORMATS)
def test_no_grad_cache_follows_in_place_optimizer_steps(fmt):
    learner = _learner("tiny-qwen3-moe", fmt)
    sequences = random_sequences([7, 5], learner.config.vocab_size, seed=4)
    linear = learner.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        first = trainer_logits(learner, sequences)
        fake = linear.fake_quant(linear.weight, torch.float32)
        assert linear.fake_quant(linear.weight, torch.float32) is fake  # cached, not re-quantized
    optimizer = torch.optim.SGD(learner.parameters(), lr=0.5)  # in place, bumps every version counter
    optimizer.zero_grad()
    _loss(learner, sequences).backward()
    optimizer.step()
    with torch.no_grad():
        after = trainer_logits(learner, sequences)
        assert not torch.equal(first, after)
        assert not torch.equal(linear.fake_quant(linear.weight, torch.float32), fake)
        fresh = _learner("tiny-qwen3-moe", fmt)
        fresh.load_state_dict_hf(learner.state_dict_hf())
        clear_packed_weights()
        assert torch.equal(after, trainer_logits(fresh, sequences))
        with torch.inference_mode():
            assert torch.equal(after, trainer_logits(learner, sequences))


@pytest.mark.parametrize("preset", PRESETS)
def test_fake_quantizes_exactly_what_quantize_model_quantizes(preset):
    fake = _learner(preset, "fp8")
    real = quantize_model(build_model(preset, kernels="aligned", seed=1), "fp8")
    fake_linears = {n for n, m in fake.named_modules() if isinstance(m, Linear) and m.fake_quant is not None}
    real_linears = {n for n, m in real.named_modules() if isinstance(m, Linear) and m.qweight is not None}
    assert fake_linears == real_linears == {n for n, m in fake.named_modules() if isinstance(m, Linear)}
    for name, module in fake.named_modules():
        if isinstance(module, Linear):
            assert isinstance(module.weight, torch.nn.Parameter) and module.qweight is None
        if isinstance(module, Experts):
            assert set(module.fake_quant) == set(dict(real.named_modules())[name].quantized)
            assert all(isinstance(getattr(module, p), torch.nn.Parameter) for p in module.fake_quant)
        if isinstance(module, Router):
            assert not hasattr(module, "fake_quant")
    assert not hasattr(fake.embedding, "fake_quant") and not hasattr(fake.lm_head, "fake_quant")
    # the same parameters as the plain model, nothing added or replaced
    plain = build_model(preset, kernels="aligned", seed=1)
    assert [n for n, _ in fake.named_parameters()] == [n for n, _ in plain.named_parameters()]
    exported, reference = fake.state_dict_hf(), plain.state_dict_hf()
    assert exported.keys() == reference.keys()
    assert all(torch.equal(exported[n], reference[n]) for n in exported)


def test_fake_quantized_projections_are_not_fused():
    model = _learner("tiny-qwen3", "fp8")
    attn = model.model.layers[0].self_attn
    x = torch.randn(3, model.config.hidden_size)
    assert fused_linear(x, model.kernels, (attn.q_proj, attn.k_proj, attn.v_proj)) is None


def test_refusals():
    with pytest.raises(ValueError, match="unknown quantization format 'int4'"):
        fake_quantize_model(build_model("tiny-qwen3", seed=0), "int4")
    fake = _learner("tiny-qwen3", "fp8")
    assert fake_quantize_model(fake, "fp8") is fake  # idempotent
    with pytest.raises(ValueError, match="already fake-quantized to 'fp8'"):
        fake_quantize_model(fake, "nvfp4")
    with pytest.raises(ValueError, match="fake-quantized"):
        quantize_model(fake, "fp8")
    with pytest.raises(ValueError, match="quantized to 'fp8-block'"):
        fake_quantize_model(quantize_model(build_model("tiny-qwen3", seed=0), "fp8-block"), "fp8-block")
    tp2 = build_model("tiny-qwen3", seed=0)
    tp2.tp = TensorParallel(world_size=2)  # only the degree is consulted before refusing
    with pytest.raises(ValueError, match="tensor parallelism"):
        fake_quantize_model(tp2, "fp8")


def test_nvfp4_refuses_an_in_dim_not_divisible_by_16_naming_the_weight():
    config = preset_dict("tiny-qwen3")
    config["intermediate_size"] = 200  # down_proj's in_features
    model = build_model(config, seed=0)
    with pytest.raises(
        ValueError, match=r"layers\.0\.mlp\.down_proj: nvfp4 needs in_features divisible by 16"
    ):
        fake_quantize_model(model, "nvfp4")
    # checked before anything changed
    assert all(m.fake_quant is None for m in model.modules() if isinstance(m, Linear))
    assert getattr(model, "fake_quant_format", None) is None
    fake_quantize_model(model, "fp8")  # fp8 has no such constraint
    with pytest.raises(ValueError, match=r"down_proj: nvfp4 needs in_features divisible by 16"):
        quantize_model(build_model(config, seed=0), "nvfp4")


def test_non_finite_master_raises_naming_the_weight():
    model = _learner("tiny-qwen3", "fp8")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up_proj: weight has 1 non-finite"):
        trainer_logits(model, random_sequences([4], model.config.vocab_size, seed=0))
