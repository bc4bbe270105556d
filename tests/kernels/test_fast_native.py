"""The fast-native set (kernels/fast_native.py), the unaligned baseline that alignment's cost is
measured against: its decode steps replay step graphs like the aligned-native set's (so a
throughput ratio compares equal engine features), a replay gives its eager bits, and it is
batch-variant where its GEMM choice follows the batch -- the inverse that keeps it a baseline."""

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


def test_gemm_choice_follows_the_batch_so_a_row_depends_on_its_batch():
    """fp32 with a 128 x 256 weight: up to 8 rows take MKL, more take the panel GEMM (the
    measured rule), so row 0 alone and row 0 in a batch of 32 differ -- while aligned-native's
    row 0 is the same in both (the inverse that makes the first check meaningful)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 128, generator=gen)
    w = torch.randn(256, 128, generator=gen)
    fast, aligned = get_kernels("fast-native"), get_kernels("aligned-native")
    with torch.no_grad():
        assert not torch.equal(fast.linear(x[:1], w)[0], fast.linear(x, w)[0])
        assert torch.equal(aligned.linear(x[:1], w)[0], aligned.linear(x, w)[0])


def test_with_autograd_it_takes_the_stock_ops_and_their_backward():
    q = torch.randn(5, 4, 8, requires_grad=True)
    k, v = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    cu = torch.tensor([0, 5])
    fast, stock = get_kernels("fast-native"), get_kernels("default")
    out = fast.attention(q, k, v, cu, cu, 0.35)
    assert torch.equal(out, stock.attention(q, k, v, cu, cu, 0.35))
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
