"""The trainer's recompute: packing plans, argument checks, mode semantics (toy model)."""

import pytest
import torch
from toy_model import ToyModel

from zeromismatch.engine import SamplingParams
from zeromismatch.train.logprobs import compute_logprobs, plan_micro_batches


def test_plan_micro_batches_respects_both_limits_and_order():
    assert plan_micro_batches([3, 3, 3], micro_batch_size=2) == [[0, 1], [2]]
    assert plan_micro_batches([5, 5, 20, 1], max_tokens_per_micro_batch=10) == [[0, 1], [2], [3]]
    assert plan_micro_batches([1, 1, 1], micro_batch_size=2, order=[2, 0, 1]) == [[2, 0], [1]]
    with pytest.raises(ValueError, match="micro_batch_size"):
        plan_micro_batches([1], micro_batch_size=0)
    with pytest.raises(ValueError, match="permutation"):
        plan_micro_batches([1, 1], order=[0, 0])


def test_argument_errors():
    model = ToyModel()
    with pytest.raises(ValueError, match="responses"):
        compute_logprobs(model, [[1]], [[2], [3]])
    with pytest.raises(ValueError, match="empty"):
        compute_logprobs(model, [[]], [[2]])
    with pytest.raises(ValueError, match="logprobs_mode"):
        compute_logprobs(model, [[1]], [[2]], logprobs_mode="logits")


def test_empty_response_and_modes():
    model = ToyModel()
    prompts, responses = [[1, 2, 3], [4, 5]], [[], [6, 7, 8]]
    params = SamplingParams(temperature=0.5, top_k=5)
    processed = compute_logprobs(model, prompts, responses, params)
    raw = compute_logprobs(model, prompts, responses, params, logprobs_mode="raw")
    assert processed[0].numel() == 0 and processed[1].shape == (3,)
    assert not torch.equal(processed[1], raw[1])
    default_raw = compute_logprobs(model, prompts, responses)  # no params: raw, temperature 1
    assert torch.equal(default_raw[1], raw[1])
