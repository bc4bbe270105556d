"""quantize_model: FP8 per channel, FP8 128x128 blocks (DeepSeek path) and NVFP4 (Nemotron path)
weights through kernels.quant_linear.

Checks: which weights are quantized (every Linear and routed expert; never embeddings,
lm_head, norms, routers, conv1d, SSM parameters); the quantized model stays close to the
dense one -- a sanity bound, not an accuracy claim: relative logit error
||q - dense|| / ||dense|| <= 0.15 for both fp8 formats and <= 0.35 for nvfp4 (measured on these
tiny random models: fp8-block about 0.07 (DeepSeek) -- the weights themselves carry ~2.6% relative
error --, nvfp4 about 0.2; printed with -s); engine mode equals trainer
mode bit for bit with the aligned kernels (inverse: not with the default kernels, whose
activation scale spans the batch); a weight update re-quantizes.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import engine_logits, random_sequences, trainer_logits
from reference_kernels import ReferenceKernels

from zeromismatch.kernels.base import QuantizedWeight
from zeromismatch.models import build_model, quantize_model
from zeromismatch.models.layers import Linear
from zeromismatch.models.moe import Experts, Router

CASES = [
    ("tiny-deepseek-v3", "fp8-block", 0.15),
    ("tiny-qwen3-moe", "fp8", 0.15),
    ("tiny-nemotron-h", "nvfp4", 0.35),
]
#: QuantizedWeight.format is the storage format; both FP8 formats store "fp8" (``block`` differs)
STORAGE = {"fp8": "fp8", "fp8-block": "fp8", "nvfp4": "nvfp4"}


@pytest.mark.parametrize(("preset", "fmt", "tolerance"), CASES)
def test_quantized_model_close_to_dense(preset, fmt, tolerance):
    dense = build_model(preset, kernels=ReferenceKernels(), seed=2)
    quantized = quantize_model(build_model(preset, kernels=ReferenceKernels(), seed=2), fmt)
    sequences = random_sequences([8, 5], dense.config.vocab_size, seed=0)
    with torch.no_grad():
        reference = trainer_logits(dense, sequences)
        got = trainer_logits(quantized, sequences)
    relative = ((got - reference).norm() / reference.norm()).item()
    print(f"{preset} {fmt}: relative logit error vs dense {relative:.4f}")
    assert 0 < relative <= tolerance


@pytest.mark.parametrize(("preset", "fmt", "tolerance"), CASES)
def test_what_is_quantized(preset, fmt, tolerance):
    model = quantize_model(build_model(preset, kernels=ReferenceKernels(), seed=0), fmt)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight is None and isinstance(m.qweight, QuantizedWeight) for m in linears)
    assert all(m.qweight.format == STORAGE[fmt] for m in linears)
    assert all((m.qweight.block is not None) == (fmt == "fp8-block") for m in linears)
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    assert experts and all(m.quantized is not None and m.up_proj is None for m in experts)
    routers = [m for m in model.modules() if isinstance(m, Router)]
    assert routers and all(m.weight is not None for m in routers)
    assert model.embedding.weight is not None and model.lm_head.weight is not None
    assert all(p.dtype.is_floating_point and p.dtype.itemsize >= 2 for p in model.parameters())


def test_quantized_linears_run_through_quant_linear():
    class Counting(ReferenceKernels):
        def __init__(self):
            self.quant_calls = 0

        def quant_linear(self, x, qweight, bias=None):
            self.quant_calls += 1
            return super().quant_linear(x, qweight, bias)

        def linear(self, x, weight, bias=None):
            assert weight.shape[0] == 8, "only the 8-expert router may use a dense linear"
            return super().linear(x, weight, bias)

    kernels = Counting()
    model = quantize_model(build_model("tiny-deepseek-v3", kernels=kernels, seed=0), "fp8")
    with torch.no_grad():
        trainer_logits(model, random_sequences([4], 512, seed=0))
    # per layer: q_a, q_b, kv_a, kv_b, o + (dense MLP: 3 | shared expert: 3)
    assert kernels.quant_calls == 3 * 8


@pytest.mark.parametrize(("preset", "fmt", "tolerance"), CASES)
def test_quantized_engine_matches_trainer_bitwise_aligned(preset, fmt, tolerance):
    model = quantize_model(build_model(preset, kernels="aligned", seed=1), fmt)
    sequences = random_sequences([7, 5], model.config.vocab_size, seed=0)
    with torch.no_grad():
        assert torch.equal(engine_logits(model, sequences, [3, 1]), trainer_logits(model, sequences))


def test_quantized_default_kernels_break_engine_trainer_parity():
    model = quantize_model(build_model("tiny-deepseek-v3", kernels="default", seed=1), "fp8")
    sequences = random_sequences([7, 5], model.config.vocab_size, seed=0)
    with torch.no_grad():
        assert not torch.equal(engine_logits(model, sequences, [3, 1]), trainer_logits(model, sequences))


@pytest.mark.parametrize(("preset", "fmt", "tolerance"), CASES)
def test_weight_update_requantizes(preset, fmt, tolerance):
    new_weights = build_model(preset, kernels=ReferenceKernels(), seed=9).state_dict_hf()
    updated = quantize_model(build_model(preset, kernels=ReferenceKernels(), seed=1), fmt)
    updated.load_state_dict_hf(new_weights)
    fresh = quantize_model(build_model(preset, kernels=ReferenceKernels(), seed=9), fmt)
    sequences = random_sequences([6], updated.config.vocab_size, seed=0)
    with torch.no_grad():
        assert torch.equal(trainer_logits(updated, sequences), trainer_logits(fresh, sequences))


def test_quantized_model_refuses_lossy_export_and_bad_formats():
    model = quantize_model(build_model("tiny-qwen3", kernels=ReferenceKernels(), seed=0), "fp8")
    with pytest.raises(ValueError, match="quantized"):
        model.state_dict_hf()
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(model, "nvfp4")
    with pytest.raises(ValueError, match="unknown quantization format 'int4'"):
        quantize_model(build_model("tiny-qwen3", kernels=ReferenceKernels()), "int4")
