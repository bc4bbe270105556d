"""Aligned attention's per-step plan cache and reused gather buffers never change a result.

The plan (query/key row indices, causal masks) is cached on the identity and in-place version of
the offsets / block-table / kv_lens tensors, and the gather buffers are reused between calls when
nothing needs autograd. These tests compare cached calls with calls after clearing the cache
(``torch.equal``), and check that a stale plan *would* give a different answer, so the version
check is what keeps them equal.
"""

from __future__ import annotations

import torch

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.aligned import attention as aligned_attention

ALIGNED = get_kernels("aligned")


def _paged_inputs(seed: int, kv_lens: list[int], block_size=16, hq=4, hkv=2, d=32):
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = max(-(-n // block_size) for n in kv_lens)
    num_blocks = len(kv_lens) * blocks_per_seq + 2
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    table = torch.randperm(num_blocks, generator=gen)[: len(kv_lens) * blocks_per_seq].view(len(kv_lens), -1)
    q = torch.randn(len(kv_lens), hq, d, generator=gen)
    cu = torch.arange(len(kv_lens) + 1, dtype=torch.int64)
    return q, k_cache, v_cache, table, cu, torch.tensor(kv_lens, dtype=torch.int64)


def _fresh(*args) -> torch.Tensor:
    aligned_attention._plan_cache = None
    return ALIGNED.paged_attention(*args)


def test_cached_plan_gives_the_same_bits_as_a_fresh_one():
    q, k_cache, v_cache, table, cu, kv_lens = _paged_inputs(0, [5, 70, 33, 1])
    first = _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    # a second layer of the same step: same batch tensors, other cache contents and queries
    q2, k2, v2 = q.flip(0).contiguous(), k_cache * 0.5, v_cache + 1.0
    cached = ALIGNED.paged_attention(q2, k2, v2, table, cu, kv_lens, 0.2)
    assert torch.equal(cached, _fresh(q2, k2, v2, table, cu, kv_lens, 0.2))
    # the first output is not a view of a reused buffer
    assert torch.equal(first, _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2))


def test_in_place_change_of_the_batch_tensors_rebuilds_the_plan():
    q, k_cache, v_cache, table, cu, kv_lens = _paged_inputs(1, [40, 40, 40])
    before = _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    kv_lens -= 7  # same tensor object, new version
    after = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    assert not torch.equal(after, before)  # a stale plan would have returned `before`
    assert torch.equal(after, _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2))
    table[0] = table[0].flip(0)
    moved = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    assert not torch.equal(moved, after)
    assert torch.equal(moved, _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2))


def test_packed_attention_plan_is_keyed_on_its_offsets():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(50, 4, 16, generator=gen)
    k, v = torch.randn(50, 2, 16, generator=gen), torch.randn(50, 2, 16, generator=gen)
    cu = torch.tensor([0, 20, 50])
    whole = ALIGNED.attention(q, k, v, cu, cu, 0.25)
    other = torch.tensor([0, 30, 50])
    split = ALIGNED.attention(q, k, v, other, other, 0.25)
    assert not torch.equal(split, whole)
    aligned_attention._plan_cache = None
    assert torch.equal(split, ALIGNED.attention(q, k, v, other, other, 0.25))
    assert torch.equal(whole, ALIGNED.attention(q, k, v, cu, cu, 0.25))


def test_autograd_inputs_do_not_use_the_reused_buffers():
    q, k_cache, v_cache, table, cu, kv_lens = _paged_inputs(3, [17, 64, 65])
    ref = _fresh(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    leaves = [t.clone().requires_grad_() for t in (q, k_cache, v_cache)]
    out = ALIGNED.paged_attention(*leaves, table, cu, kv_lens, 0.2)
    # another call in between must not disturb the tensors saved for backward
    ALIGNED.paged_attention(q * 2, k_cache, v_cache, table, cu, kv_lens, 0.2)
    assert torch.equal(out, ref)
    out.square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in leaves)


def test_inference_tensors_are_planned_every_call():
    # inference tensors have no version counter, so an in-place edit could not be seen: no caching
    with torch.inference_mode():
        q, k_cache, v_cache, table, cu, kv_lens = _paged_inputs(3, [40, 12])
        before = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
        kv_lens -= 5
        after = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    assert not torch.equal(after, before)
    assert torch.equal(
        after,
        _fresh(q.clone(), k_cache.clone(), v_cache.clone(), table.clone(), cu.clone(), kv_lens.clone(), 0.2),
    )


def test_buffers_and_plans_made_under_inference_mode_do_not_leak_out_of_it():
    # the engine's guard runs the kernel self-check under inference mode before a model trains
    q, k_cache, v_cache, table, cu, kv_lens = _paged_inputs(4, [40, 12])
    aligned_attention._plan_cache = None
    with torch.inference_mode():
        inside = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    with torch.no_grad():
        outside = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    assert torch.equal(inside, outside)
    q = q.clone().requires_grad_(True)
    out = ALIGNED.paged_attention(q, k_cache, v_cache, table, cu, kv_lens, 0.2)
    out.sum().backward()
    assert torch.equal(out.detach(), outside) and q.grad is not None
