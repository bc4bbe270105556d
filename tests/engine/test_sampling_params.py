"""SamplingParams validation: each bad field gets one clear error naming it."""

import pytest

from zeromismatch.engine import SamplingParams


def test_defaults_and_normalisation():
    p = SamplingParams(temperature=1, top_p=1, stop_token_ids=[3, 4])
    assert p.temperature == 1.0 and isinstance(p.temperature, float)
    assert p.stop_token_ids == (3, 4)
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(top_k=-1).top_k == -1  # vLLM's "off"


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        ({"temperature": -0.1}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"temperature": 1e-40}, ValueError, "temperature"),  # logits / T overflowed to nan logprobs
        ({"top_k": 2**63}, ValueError, "top_k"),  # overflowed the sampler's int64 tensor mid-step
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"top_k": 2.5}, TypeError, "top_k"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"max_tokens": True}, TypeError, "max_tokens"),
        ({"seed": 1.5}, TypeError, "seed"),
        ({"stop_token_ids": [-1]}, ValueError, "stop_token_ids"),
        ({"logprobs_mode": "logits"}, ValueError, "logprobs_mode"),
    ],
)
def test_bad_values_are_rejected(kwargs, error, field):
    with pytest.raises(error, match=field):
        SamplingParams(**kwargs)


def test_smallest_temperature_and_largest_top_k_are_accepted():
    assert SamplingParams(temperature=1e-5).temperature == 1e-5
    assert SamplingParams(top_k=2**31 - 1).top_k == 2**31 - 1
