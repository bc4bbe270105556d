"""The kernel-routing audit (tests/models/test_kernel_routing.py) on the Megatron model: while its
forward runs (packed thd through the learner interface, padded sbhd through ``GPTModel.forward``, with
and without autograd), no matmul / softmax / norm / activation torch function is called outside a
KernelSet call. So Megatron's modules contribute structure and communication, never arithmetic."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from megatron_helpers import right_padded, sequences
from torch.overrides import TorchFunctionMode

from zeromismatch.integrations.megatron import build_megatron_model
from zeromismatch.kernels.aligned import AlignedKernels
from zeromismatch.models import ForwardBatch

pytestmark = pytest.mark.megatron

_FORBIDDEN = {
    F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.bmm, torch.baddbmm,
    torch.einsum, torch.softmax, torch.Tensor.softmax, F.softmax, F.log_softmax, torch.log_softmax, F.silu,
    F.relu, F.gelu, torch.rsqrt, torch.Tensor.rsqrt, F.scaled_dot_product_attention, F.layer_norm,
    F.rms_norm, torch.sigmoid, torch.cos, torch.sin, torch.Tensor.mean, torch.mean,
}  # fmt: skip


class _CountingKernels(AlignedKernels):
    """The aligned set, marking when execution is inside one of its ops."""

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


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"])
def test_no_math_outside_kernels_in_the_megatron_model(preset, grad):
    kernels = _CountingKernels()
    model = build_megatron_model(preset, kernels=kernels, seed=0)
    seqs = sequences(seed=0, lengths=(5, 3))
    audit = _Audit(kernels)
    with torch.set_grad_enabled(grad), audit:
        model.compute_logits(model(ForwardBatch.for_training(seqs)))
        model.padded_logits(right_padded(seqs))
    assert audit.violations == []
    layers = model.config.num_hidden_layers
    assert kernels.calls["lm_head"] == 2
    if preset == "tiny-nemotron-h":  # "M*M-E": one pre-norm per block, no RoPE
        expected = {"linear", "row_parallel_linear", "attention", "causal_conv1d", "ssm_scan",
                    "gated_rms_norm", "relu2", "moe_route", "moe_experts"}  # fmt: skip
        assert expected <= kernels.calls.keys() and "rope" not in kernels.calls
        assert kernels.calls["ssm_scan"] == kernels.calls["causal_conv1d"] == 2 * 2
        assert kernels.calls["attention"] == 2 and kernels.calls["rms_norm"] == 2 * (layers + 1)
        return
    expected = {"linear", "row_parallel_linear", "rms_norm", "rope", "attention"}
    expected |= {"moe_route", "moe_experts"} if preset != "tiny-qwen3" else set()
    expected |= {"silu_mul"} if preset != "tiny-qwen3-moe" else set()
    assert expected <= kernels.calls.keys()
    assert kernels.calls["attention"] == 2 * layers
    # input, pre-MLP and q, k norms per layer (MLA: its q and kv low-rank norms); the final norm
    assert kernels.calls["rms_norm"] == 2 * (4 * layers + 1)
    assert kernels.calls["rope"] == 2 * layers * (2 if preset == "tiny-deepseek-v3" else 1)
