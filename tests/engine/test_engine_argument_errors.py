"""The engine's API edge cases: each bad argument is one error naming it, before any work.

Sizes (``max_num_seqs`` and the rest) are checked before the model is built, by the names the
caller used; ``max_tokens=0`` names ``max_tokens``; ``update_weights`` refuses an empty mapping (it
would bump the version and change nothing) and float64 tensors for a non-float64 model (the cast
would round them silently), changing nothing; numpy integer token ids are token ids like Python
ints, bools are not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zeromismatch.engine.llm as llm_module
from zeromismatch.engine.llm import LLM
from zeromismatch.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


@pytest.fixture(scope="module")
def engine():
    return LLM("tiny-qwen3", max_num_seqs=2, block_size=4)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("max_num_seqs", 0, ValueError),
        ("max_num_seqs", -1, ValueError),
        ("max_num_batched_tokens", 0, ValueError),
        ("block_size", 0, ValueError),
        ("num_blocks", 0, ValueError),
        ("max_model_len", 0, ValueError),
        ("prefill_chunk", 0, ValueError),
        ("max_num_seqs", 2.0, TypeError),
        ("max_num_seqs", True, TypeError),
        ("block_size", None, TypeError),
    ],
)
def test_bad_engine_sizes_name_the_argument_before_the_model_is_built(monkeypatch, name, value, error):
    monkeypatch.setattr(llm_module, "resolve_model", lambda *a, **k: pytest.fail("built the model"))
    with pytest.raises(error, match=rf"^{name} must be"):
        LLM("tiny-qwen3", **{name: value})


def test_max_tokens_zero_names_max_tokens():
    with pytest.raises(ValueError, match=r"max_tokens must be >= 1, got 0"):
        SamplingParams(max_tokens=0)


def test_an_empty_update_is_refused_and_changes_nothing(engine):
    version = engine.weight_version
    with pytest.raises(ValueError, match="no weights given"):
        engine.update_weights({})
    assert engine.weight_version == version


def test_float64_weights_are_refused_naming_the_weight(engine):
    weights = engine.model.state_dict_hf()
    name = next(iter(weights))
    before, version = weights[name].clone(), engine.weight_version
    nudged = (weights[name].double() + 1e-12).contiguous()  # not representable in fp32: would round
    with pytest.raises(ValueError, match=rf"weight '{name}' is float64 but the model holds torch.float32"):
        engine.update_weights({name: nudged})
    assert engine.weight_version == version
    assert torch.equal(engine.model.state_dict_hf()[name], before)
    engine.update_weights({name: weights[name].bfloat16()})  # other floating dtypes are still cast
    assert engine.weight_version == version + 1
    engine.update_weights({name: before})


def test_numpy_integer_token_ids_are_token_ids(engine):
    prompt = [5, 17, 3, 42]
    expected = engine.generate([prompt], GREEDY)[0]
    for numpy_prompt in ([np.int64(t) for t in prompt], np.array(prompt, dtype=np.int32), np.array(prompt)):
        output = engine.generate([numpy_prompt], GREEDY)[0]
        assert output.error is None, output.error
        assert output.token_ids == expected.token_ids and output.logprobs == expected.logprobs
        assert all(type(t) is int for t in output.prompt_token_ids)


@pytest.mark.parametrize("bad", [True, np.bool_(True), 3.0, np.float64(3.0)])
def test_bools_and_floats_are_not_token_ids(engine, bad):
    with pytest.raises(TypeError, match="prompt token ids must be ints"):
        engine.add_request([5, bad])
