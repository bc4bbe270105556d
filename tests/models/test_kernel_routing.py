"""Model code runs every numerically relevant op through its KernelSet, in both modes, and
trainer mode supports autograd.

A ``TorchFunctionMode`` records every matmul / softmax / norm / activation torch function
called *outside* a kernel call while the model runs: the list must be empty. Switching the
kernel set therefore switches all numerics.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import engine_logits, random_sequences, trainer_logits
from reference_kernels import ReferenceKernels
from torch.overrides import TorchFunctionMode

from zeromismatch.models import TINY_PRESETS, build_model

_FORBIDDEN = {
    F.linear,
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.bmm,
    torch.einsum,
    torch.softmax,
    torch.Tensor.softmax,
    F.softmax,
    F.log_softmax,
    torch.log_softmax,
    F.silu,
    F.relu,
    torch.rsqrt,
    torch.Tensor.rsqrt,
    F.scaled_dot_product_attention,
    F.conv1d,
    torch.sigmoid,
    F.softplus,
    torch.Tensor.mean,
    torch.mean,
}


class _CountingKernels(ReferenceKernels):
    """Reference kernels that mark when execution is inside a kernel."""

    def __init__(self):
        self.depth = 0
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or not callable(attr) or name in ("depth", "calls"):
            return attr

        def wrapped(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            self.depth += 1
            try:
                return attr(*args, **kwargs)
            finally:
                self.depth -= 1

        return wrapped


class _Audit(TorchFunctionMode):
    def __init__(self, kernels):
        super().__init__()
        self.kernels, self.violations = kernels, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _FORBIDDEN and self.kernels.depth == 0:
            self.violations.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_no_math_outside_kernels(preset):
    kernels = _CountingKernels()
    model = build_model(preset, kernels=kernels, seed=0)
    sequences = random_sequences([5, 3], model.config.vocab_size, seed=0)
    audit = _Audit(kernels)
    with torch.no_grad(), audit:
        trainer_logits(model, sequences)
        engine_logits(model, sequences, [2, 1])
    assert audit.violations == []
    assert kernels.calls["linear"] > 0 and kernels.calls["lm_head"] > 0
    expected = {"attention", "paged_attention"}
    if preset == "tiny-nemotron-h":
        expected |= {"causal_conv1d", "ssm_scan", "gated_rms_norm", "relu2", "moe_experts"}
    else:
        expected |= {"rope", "rms_norm"}
    if preset in ("tiny-qwen3", "tiny-deepseek-v3"):
        expected.add("silu_mul")
    if preset != "tiny-qwen3":
        expected |= {"moe_route", "moe_experts"}
    assert expected <= kernels.calls.keys()


@pytest.mark.parametrize("kernel_set", ["aligned", "default"])
@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_trainer_mode_backpropagates_to_every_parameter(preset, kernel_set):
    model = build_model(preset, kernels=kernel_set, seed=1)
    sequences = random_sequences([7, 4], model.config.vocab_size, seed=0)
    logprobs = model.kernels.log_softmax(trainer_logits(model, sequences))
    targets = torch.cat([s.roll(-1) for s in sequences])
    loss = -logprobs.gather(1, targets[:, None]).mean()
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert no_grad == []
