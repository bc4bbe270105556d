"""The two speed devices of the aligned set change no bits: prepacked GEMM weights and the
vector-path elementwise ops (and the in-place row-parallel tree), exact, at 1 and 2 threads.

- ``vector_path(op, x)``: every element of torch's fused silu / sigmoid / softplus goes
  through the op's vectorised loop body, so an element's bits do not depend on where it
  sits in the buffer, on the buffer's size, or on the thread count -- including buffers of
  >= 32768 elements, which torch splits across threads. Inverse: the plain stock op does
  depend on position (its scalar tail and per-thread chunk tails round differently).
- Packed weights: ``row_invariant_linear`` with the cached packed weight gives the bits of
  the plain-weight GEMM (cache disabled), for views too; an in-place update of the weight
  (``copy_``, an AdamW step, a write to one expert of a stacked weight) is seen on the next
  call; dead weights leave the cache; inference tensors and weights under autograd are not
  cached; writes through ``.data`` are not seen until ``clear_packed_weights()`` (the
  documented caveat, recorded here).
- ``row_invariant_pieces`` == one call per piece (``row_invariant_linear``, or for small fp32
  pieces ``batched_pieces`` of that piece alone; tests/kernels/test_batched_pieces.py); ``tree_sum_fp32_`` ==
  ``tree_sum`` of the upcast partials.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import torch_threads as _threads

from zeromismatch.kernels import collectives, get_kernels
from zeromismatch.kernels.aligned import dense, gemm

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
OPS = {"silu": F.silu, "sigmoid": torch.sigmoid, "softplus": F.softplus}


@contextlib.contextmanager
def _cache_budget(nbytes: int):
    saved = gemm._PACKED.budget_bytes
    gemm._PACKED.budget_bytes = nbytes
    gemm.clear_packed_weights()
    try:
        yield
    finally:
        gemm._PACKED.budget_bytes = saved
        gemm.clear_packed_weights()


def _randn(shape, dtype=torch.float32, seed=0, scale=1.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


# ---- vector path ----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    size=st.one_of(st.integers(1, 300), st.integers(32000, 70000)),
    op=st.sampled_from(sorted(OPS)),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_vector_path_element_bits_ignore_position_size_and_threads(size, op, dtype, seed, data):
    fn = OPS[op]
    x = _randn((size,), dtype, seed, scale=6.0)
    start = data.draw(st.integers(0, size - 1))
    stop = data.draw(st.integers(start + 1, size))
    results = []
    for threads in (1, 2):
        with _threads(threads):
            full = dense.vector_path(fn, x)
            assert torch.equal(dense.vector_path(fn, x[start:stop]), full[start:stop])
            assert torch.equal(dense.vector_path(fn, x[start : start + 1]), full[start : start + 1])
            results.append(full)
    assert torch.equal(results[0], results[1])


def test_vector_path_in_place_equals_out_of_place():
    for threads in (1, 2):
        with _threads(threads):
            for size in (5, 64, 1000, 32833, 65601):
                x = _randn((size,), seed=size, scale=5.0)
                assert torch.equal(
                    dense.vector_path_(lambda t: F.silu(t, inplace=True), x.clone()),
                    dense.vector_path(F.silu, x),
                )


def test_plain_stock_ops_depend_on_position():
    # inverse: the same values computed by the plain op inside a bigger buffer or alone differ
    for op, fn in OPS.items():
        x = _randn((4000,), seed=1, scale=6.0)
        full = fn(x)
        found = any(not torch.equal(fn(x[a : a + 31]), full[a : a + 31]) for a in range(0, 3900, 31))
        assert found, op


def test_plain_silu_depends_on_thread_chunks():
    # inverse at 2 threads and > 32768 elements: the first thread's chunk ends mid-vector,
    # its tail is scalar; alone, the same values are in the vector body
    with _threads(2):
        found = False
        size = 2 * (32768 + 31)  # each thread gets 32799 elements: a 31-element scalar tail
        for seed in range(20):
            x = _randn((size,), seed=seed, scale=6.0)
            window = slice(32799 - 31, 32799)
            if not torch.equal(F.silu(x)[window], F.silu(x[window].clone().repeat(3))[:31]):
                found = True
                break
        assert found


@settings(max_examples=10, deadline=None)
@given(m=st.integers(1, 40), h=st.sampled_from([1000, 1536, 2999]), seed=st.integers(0, 2**16))
def test_silu_mul_row_invariant_on_large_batches_at_two_threads(m, h, seed):
    gate, up = _randn((m, h), seed=seed, scale=4.0), _randn((m, h), seed=seed + 1)
    with _threads(2):
        full = ALIGNED.silu_mul(gate, up)
        for i in range(0, m, max(1, m // 5)):
            assert torch.equal(ALIGNED.silu_mul(gate[i : i + 1], up[i : i + 1])[0], full[i])


def test_default_silu_mul_violates_row_invariance_at_two_threads():
    with _threads(2):
        for seed in range(10):
            gate, up = _randn((33, 1001), seed=seed, scale=4.0), _randn((33, 1001), seed=seed + 1)
            full = DEFAULT.silu_mul(gate, up)
            if any(
                not torch.equal(DEFAULT.silu_mul(gate[i : i + 1], up[i : i + 1])[0], full[i])
                for i in range(33)
            ):
                return
    pytest.fail("default silu_mul was row-invariant on every input tried")


# ---- packed weights -------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 600),
    n=st.integers(1, 300),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_packed_weight_gives_the_plain_weight_bits(m, k, n, dtype, threads, seed):
    x, w = _randn((m, k), dtype, seed), _randn((n, k), dtype, seed + 1)
    stacked = _randn((3, n, k), dtype, seed + 2)
    with _threads(threads):
        with _cache_budget(0):
            plain = gemm.row_invariant_linear(x, w)
            plain_view = gemm.row_invariant_linear(x, stacked[1])
        with torch.no_grad():
            for _ in range(2):  # a miss (packs), then a hit
                assert torch.equal(gemm.row_invariant_linear(x, w), plain)
                assert torch.equal(gemm.row_invariant_linear(x, stacked[1]), plain_view)


def test_in_place_updates_are_seen():
    x = _randn((3, 64), seed=0)
    w = torch.nn.Parameter(_randn((32, 64), seed=1))
    stacked = _randn((4, 32, 64), seed=2)
    with torch.no_grad():
        before = gemm.row_invariant_linear(x, w)
        w.copy_(_randn((32, 64), seed=3))
        assert not torch.equal(gemm.row_invariant_linear(x, w), before)
        assert torch.equal(gemm.row_invariant_linear(x, w), gemm.row_invariant_linear(x, w.detach().clone()))
        gemm.row_invariant_linear(x, stacked[2])
        stacked[2].add_(1.0)  # a write to one expert bumps the version its views share
        assert torch.equal(
            gemm.row_invariant_linear(x, stacked[2]), gemm.row_invariant_linear(x, stacked[2].clone())
        )
    w.grad = torch.ones_like(w)
    opt = torch.optim.AdamW([w], lr=0.1)
    with torch.no_grad():
        before = gemm.row_invariant_linear(x, w)
    opt.step()
    with torch.no_grad():
        after = gemm.row_invariant_linear(x, w)
        assert not torch.equal(after, before)
        assert torch.equal(after, gemm.row_invariant_linear(x, w.detach().clone()))


def test_writes_through_data_are_not_seen_until_the_cache_is_cleared():
    # the documented caveat: .data writes bypass the version counter
    x = _randn((2, 16), seed=0)
    w = torch.nn.Parameter(_randn((8, 16), seed=1))
    with torch.no_grad():
        stale = gemm.row_invariant_linear(x, w)
        w.data.copy_(_randn((8, 16), seed=2))
        assert torch.equal(gemm.row_invariant_linear(x, w), stale)
        gemm.clear_packed_weights()
        assert torch.equal(gemm.row_invariant_linear(x, w), gemm.row_invariant_linear(x, w.detach().clone()))


def test_what_is_not_cached_and_dead_weights_leave():
    gemm.clear_packed_weights()
    x = _randn((2, 16), seed=0)
    with torch.inference_mode():
        w_inf = _randn((8, 16), seed=1)
        gemm.row_invariant_linear(x, w_inf)
    w_grad = torch.nn.Parameter(_randn((8, 16), seed=2))
    gemm.row_invariant_linear(x, w_grad)  # grad mode on: trained weights are not cached
    assert len(gemm._PACKED.entries) == 0
    w = _randn((8, 16), seed=3)
    with torch.no_grad():
        gemm.row_invariant_linear(x, w)
    assert len(gemm._PACKED.entries) == 1
    del w
    assert len(gemm._PACKED.entries) == 0


def test_budget_evicts_least_recently_used():
    weights = [_randn((64, 64), seed=s) for s in range(6)]
    x = _randn((2, 64), seed=9)
    one = int(torch.ops.mkldnn._nbytes(torch.ops.mkldnn._reorder_linear_weight(weights[0], None)))
    with _cache_budget(4 * one + one // 2), torch.no_grad():
        for w in weights:
            gemm.row_invariant_linear(x, w)
        assert len(gemm._PACKED.entries) == 4
        assert gemm._PACKED.nbytes <= gemm._PACKED.budget_bytes


# ---- row-parallel pieces and the in-place tree ----------------------------------------------
def _one_piece(x_piece, w_piece):
    if gemm.uses_batched_pieces(x_piece.shape[1], w_piece.shape[0], x_piece.dtype):
        return gemm.batched_pieces(x_piece, w_piece, 1)[0]
    return gemm.row_invariant_linear(x_piece, w_piece)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 20),
    k8=st.integers(1, 40),
    n=st.integers(2, 120),
    pieces=st.sampled_from([1, 2, 4, 8]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_row_invariant_pieces_equal_per_piece_gemms(m, k8, n, pieces, dtype, seed):
    k = 8 * k8
    x, w = _randn((m, k), dtype, seed), _randn((n, k), dtype, seed + 1)
    p = k // pieces
    with torch.no_grad():
        batched = gemm.row_invariant_pieces(x, w, pieces)
        with _cache_budget(0):
            one_by_one = [
                _one_piece(x[:, j * p : (j + 1) * p], w[:, j * p : (j + 1) * p]) for j in range(pieces)
            ]
    assert all(torch.equal(a, b) for a, b in zip(batched, one_by_one))
    parts = [b.clone() for b in batched]
    assert torch.equal(collectives.tree_sum_fp32_(parts), collectives.tree_sum([b.float() for b in batched]))


def test_tree_sum_fp32_handles_odd_counts_and_bf16():
    for count in (1, 2, 3, 5, 8):
        parts = [_randn((3, 7), torch.bfloat16, s) for s in range(count)]
        assert torch.equal(
            collectives.tree_sum_fp32_(parts), collectives.tree_sum([p.float() for p in parts])
        )


def test_moe_cached_path_equals_uncached_path():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 32, generator=gen)
    w_gate, w_up, w_down = (
        torch.randn(6, 24, 32, generator=gen),
        torch.randn(6, 24, 32, generator=gen),
        torch.randn(6, 32, 24, generator=gen),
    )
    weights, ids = ALIGNED.moe_route(torch.randn(9, 6, generator=gen), 2)
    with torch.no_grad():
        cached = ALIGNED.moe_experts(x, weights, ids, w_gate, w_up, w_down)
        with _cache_budget(0):
            uncached = ALIGNED.moe_experts(x, weights, ids, w_gate, w_up, w_down)
    assert torch.equal(cached, uncached)
