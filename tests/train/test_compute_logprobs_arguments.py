"""compute_logprobs: ``kernels=`` selects the kernel set of the whole recompute (forward, LM head,
log-softmax), restoring the model's own set afterwards; ``order`` must be a permutation."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels import get_kernels
from zeromismatch.models import TINY_PRESETS, build_model
from zeromismatch.train.logprobs import compute_logprobs


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 13, 3, 7)]
    responses = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (4, 1, 6, 3, 11)]
    return prompts, responses


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_kernels_argument_runs_the_whole_recompute_under_that_set(preset):
    prompts, responses = _inputs()
    aligned_model = build_model(preset, kernels="aligned", seed=0)
    default_model = build_model(preset, kernels="default", seed=0)  # same weights
    via_argument = torch.cat(compute_logprobs(aligned_model, prompts, responses, kernels="default"))
    default_trainer = torch.cat(compute_logprobs(default_model, prompts, responses))
    assert torch.equal(via_argument, default_trainer)
    assert aligned_model.kernels is get_kernels("aligned")  # restored
    # and the other way round
    via_argument = torch.cat(compute_logprobs(default_model, prompts, responses, kernels="aligned"))
    assert torch.equal(via_argument, torch.cat(compute_logprobs(aligned_model, prompts, responses)))
    assert default_model.kernels is get_kernels("default")


def test_kernel_sets_differ_on_these_inputs():
    """Inverse: the two sets give different logprobs here, so the equality above is not vacuous."""
    prompts, responses = _inputs()
    for preset in TINY_PRESETS:
        aligned_model = build_model(preset, kernels="aligned", seed=0)
        default_model = build_model(preset, kernels="default", seed=0)
        aligned = torch.cat(compute_logprobs(aligned_model, prompts, responses))
        default = torch.cat(compute_logprobs(default_model, prompts, responses))
        assert not torch.equal(aligned, default), preset


def test_model_kernels_are_restored_when_the_recompute_fails():
    model = build_model("tiny-qwen3", kernels="aligned", seed=0)
    with pytest.raises(ValueError, match="outside"):
        compute_logprobs(model, [[1, 2]], [[600, 3]], kernels="default")  # 600 >= vocab 512
    assert model.kernels is get_kernels("aligned")


@pytest.mark.parametrize(
    "order",
    [[0, 0, 2, 3, 5, 5], [0, 2, 3, 5], [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 6], [-1, 1, 2, 3, 4, 5],
     [True, 1, 2, 3, 4, 5], [0.0, 1, 2, 3, 4, 5]],
)  # fmt: skip
def test_order_must_be_a_permutation_of_the_prompts(order):
    model = build_model("tiny-qwen3", kernels="aligned", seed=0)
    prompts = [[5], [1, 2, 3], [7] * 20, [9, 8], [4, 4, 4, 4], [3]]
    responses = [[6], [], [11, 12, 13], [100], [], [200, 201]]
    with pytest.raises(ValueError, match=r"order must be a permutation of range\(6\)"):
        compute_logprobs(model, prompts, responses, order=order)
    # a valid permutation (including the indices of empty responses) is accepted
    out = compute_logprobs(model, prompts, responses, order=[5, 4, 3, 2, 1, 0])
    assert [len(o) for o in out] == [1, 0, 3, 1, 0, 2]
