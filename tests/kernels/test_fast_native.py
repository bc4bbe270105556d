"""The fast-native set (kernels/fast_native.py), the unaligned baseline that alignment's cost is
measured against: its decode steps replay step graphs like the aligned-native set's (so a
throughput ratio compares equal engine features), a replay gives its eager bits, and its head
runs in the activation dtype."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.llm import build_preset
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import available, unavailable_reason

pytestmark = pytest.mark.skipif(not available(), reason=f"native kernels: {unavailable_reason()}")


def _generate(model, kernels: str, enforce_eager: bool):
    prompts = [[(7 * i + j) % 500 + 1 for j in range(12)] for i in range(6)]
    llm = LLM(model, kernels, max_num_seqs=6, enable_prefix_caching=False, enforce_eager=enforce_eager)
    outputs = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=10, seed=3))
    model.set_kernels("aligned")
    return outputs, llm.runner.graphs.stats()


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-nemotron-h"])
def test_decode_steps_replay_graphs_with_the_eager_bits(preset):
    model = build_preset(preset, "aligned", torch.float32, 0)
    replayed, stats = _generate(model, "fast-native", enforce_eager=False)
    eager, eager_stats = _generate(model, "fast-native", enforce_eager=True)
    assert stats["disabled_reason"] is None and stats["replays"] > 0, stats
    assert eager_stats["replays"] == 0
    for a, b in zip(replayed, eager):
        assert a.token_ids == b.token_ids
        assert torch.equal(torch.tensor(a.logprobs), torch.tensor(b.logprobs))
    # inverse: the default set cannot be captured (it reads lengths on the host), so it runs eagerly
    _, default_stats = _generate(model, "default", enforce_eager=False)
    assert default_stats["replays"] == 0 and default_stats["disabled_reason"]


def test_bf16_head_rounds_logits_to_bf16_where_aligned_native_keeps_fp32():
    """The fast set's lm_head runs in the activation dtype (a bf16 head), as fast stacks do: its
    logits are bf16 values; aligned-native's fp32-output head on the same bf16 inputs is not."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(8, 128, generator=gen).bfloat16()
    weight = torch.randn(512, 128, generator=gen).bfloat16()
    fast, aligned = get_kernels("fast-native"), get_kernels("aligned-native")
    with torch.no_grad():
        fast_logits, aligned_logits = fast.lm_head(hidden, weight), aligned.lm_head(hidden, weight)
    assert fast_logits.dtype == aligned_logits.dtype == torch.float32
    assert torch.equal(fast_logits, fast_logits.bfloat16().float())
    assert not torch.equal(aligned_logits, aligned_logits.bfloat16().float())  # the inverse


def test_with_autograd_it_takes_the_stock_ops_and_their_backward():
    q = torch.randn(5, 4, 8, requires_grad=True)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    cu = torch.tensor([0, 5])
    fast, stock = get_kernels("fast-native"), get_kernels("default")
    out = fast.attention(q, k, v, cu, cu, 0.35)
    assert torch.equal(out, stock.attention(q, k, v, cu, cu, 0.35))
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
