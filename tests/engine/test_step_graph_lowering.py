"""Step graphs replay plain data movement and fp32 adds natively (``kernels/capture/ops_as_native_calls.py``:
``zm_copy_rows``, ``zm_add_f32``): each lowered pattern is recorded as a native call, a replay on new
inputs gives the eager ops' bits (``torch.equal`` on the raw bytes), an index a torch op would reject
makes the replay raise ``ReplayDiverged`` instead of writing outside the tensor, and the layouts it does
not take stay torch ops (and still replay exactly)."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels.capture.record_replay import ReplayDiverged, capture
from zeromismatch.kernels.native import _build

pytestmark = pytest.mark.native


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _case_inputs():
    gen = torch.Generator().manual_seed(0)
    fused = torch.randn(8, 6, 16, generator=gen)  # q and k heads side by side, as a fused projection
    cache = torch.zeros(32, 2, 16)
    slots = torch.tensor([3, 9, 0, 31, 7, 12, 5, 20])
    table = torch.randn(50, 16, generator=gen)
    ids = torch.tensor([4, 4, 49, 0, 17, 8, 8, 1])
    a, b = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    return dict(fused=fused, cache=cache, slots=slots, table=table, ids=ids, a=a, b=b)


def _step(t):
    q, k = t["fused"][:, :4], t["fused"][:, 4:]  # column slices
    t["cache"].index_copy_(0, t["slots"], k)  # a K write from a strided source
    return (
        q.contiguous(),  # clone of a column slice
        torch.cat((q[..., :8], k[:, :1, 8:].expand(-1, 4, -1)), dim=-1),  # MLA's key: an expanded part
        torch.cat((q, k), dim=1),  # cat of column slices
        torch.cat((t["a"], t["b"]), dim=-1),  # cat along the last dim
        t["table"][t["ids"]],  # gather rows (an embedding lookup)
        t["a"] + t["b"],  # fp32 add
    )


def test_lowered_ops_run_natively_and_replay_the_eager_bits():
    if not _build.available():
        pytest.skip(_build.unavailable_reason())
    inputs = _case_inputs()
    with torch.no_grad():
        graph, outs = capture(lambda: _step(inputs), held=list(inputs.values()))
        assert graph.refused is None
        names = graph.native_call_names()
        # index_copy_ and index: row copies; the clone and the two cats' four parts: strided copies
        assert names.count("zm_copy_rows") == 2 and names.count("zm_copy_strided") == 1 + 2 + 2 + 2
        assert names.count("zm_add_f32") == 1
        assert not [
            call for call, args in graph.records if call.__name__ == "_call_op"
        ]  # nothing left to torch
        gen = torch.Generator().manual_seed(1)
        fresh = {
            "fused": torch.randn(8, 6, 16, generator=gen),
            "slots": torch.randperm(32, generator=gen)[:8],
            "ids": torch.randint(0, 50, (8,), generator=gen),
            "a": torch.randn(8, 16, generator=gen),
            "b": torch.randn(8, 16, generator=gen),
        }
        for name, value in fresh.items():
            inputs[name].copy_(value)
        graph.replay()
        expected_inputs = {**_case_inputs(), **{k: v.clone() for k, v in fresh.items()}}
        expected_inputs["cache"] = torch.zeros(32, 2, 16)
        expected = _step(expected_inputs)
    for got, want in zip(outs, expected):
        assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(inputs["cache"][fresh["slots"]], fresh["fused"][:, 4:])


def test_an_index_outside_the_tensor_diverges_instead_of_writing():
    if not _build.available():
        pytest.skip(_build.unavailable_reason())
    table, ids = torch.randn(10, 4), torch.tensor([1, 2])
    cache, slots, rows = torch.zeros(6, 4), torch.tensor([0, 5]), torch.randn(2, 4)
    with torch.no_grad():
        graph, _ = capture(
            lambda: (table[ids], cache.index_copy_(0, slots, rows)), held=[table, ids, cache, slots, rows]
        )
        assert graph.native_call_names() == ["zm_copy_rows", "zm_copy_rows"]
        before = cache.clone()
        ids.copy_(torch.tensor([1, 10]))
        with pytest.raises(ReplayDiverged, match="zm_copy_rows"):
            graph.replay()
        ids.copy_(torch.tensor([1, 2]))
        slots.copy_(torch.tensor([0, -1]))
        with pytest.raises(ReplayDiverged, match="zm_copy_rows"):
            graph.replay()
    assert torch.equal(cache, before)  # the refused write wrote nothing


def test_layouts_it_does_not_take_stay_torch_ops():
    if not _build.available():
        pytest.skip(_build.unavailable_reason())
    x, row = torch.randn(4, 8), torch.randn(8)
    half = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        graph, (broadcast, bf16_sum, transposed) = capture(
            lambda: (x + row, half + half, x.t().contiguous()), held=[x, row, half]
        )
        # a broadcast add and a bf16 add stay torch's; a transposed copy is a strided copy
        assert graph.refused is None and graph.native_call_names() == ["zm_copy_strided"]
        x.copy_(torch.randn(4, 8))
        graph.replay()
        assert torch.equal(broadcast, x + row) and torch.equal(transposed, x.t().contiguous())
        assert torch.equal(bf16_sum, half + half)


def test_views_whose_bytes_are_not_their_values_are_not_lowered():
    """A lazily negated view holds the un-negated values: a byte copy would replay the wrong sign
    (found in review), so such operands keep the torch op."""
    if not _build.available():
        pytest.skip(_build.unavailable_reason())
    x = torch.tensor([1.0, 2.0, 3.0])
    lazy = torch._neg_view(x)
    with torch.no_grad():
        graph, out = capture(lambda: lazy.clone(), held=[x])
        assert graph.native_call_names() == []
        x.copy_(torch.tensor([10.0, 20.0, 30.0]))
        graph.replay()
    assert torch.equal(out, torch.tensor([-10.0, -20.0, -30.0]))


def test_a_negative_gather_index_counts_from_the_end_as_in_torch():
    if not _build.available():
        pytest.skip(_build.unavailable_reason())
    table, ids = torch.randn(10, 4), torch.tensor([-1, 2])
    with torch.no_grad():
        graph, out = capture(lambda: table[ids], held=[table, ids])
        assert graph.native_call_names() == ["zm_copy_rows"]
        ids.copy_(torch.tensor([3, -10]))
        graph.replay()
        assert torch.equal(out, table[ids])
        ids.copy_(torch.tensor([3, -11]))  # outside: torch raises, the replay diverges
        with pytest.raises(ReplayDiverged):
            graph.replay()
