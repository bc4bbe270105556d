"""Attention kernels: aligned bitwise invariance (prefill / chunked / paged decode / batch), accuracy.

Invariance tests compare with ``torch.equal``; each has an inverse test showing the default set
breaks the same property on a deterministic input. Accuracy is against a float64 reference.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.kernels import get_kernels

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cu(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return out


def _seq(gen: torch.Generator, length: int, hq: int, hkv: int, dqk: int, dv: int, dtype):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return rnd(length, hq, dqk), rnd(length, hkv, dqk), rnd(length, hkv, dv)


class PagedCache:
    """A paged KV cache holding several sequences in shuffled blocks; unused slots hold nan."""

    def __init__(self, gen, seqs_kv: list[tuple[torch.Tensor, torch.Tensor]], block_size: int):
        self.block_size = block_size
        need = [-(-k.shape[0] // block_size) for k, _ in seqs_kv]
        total = sum(need) + 3
        k0, v0 = seqs_kv[0]
        self.k = torch.full((total, block_size, *k0.shape[1:]), float("nan"), dtype=k0.dtype)
        self.v = torch.full((total, block_size, *v0.shape[1:]), float("nan"), dtype=v0.dtype)
        order = torch.randperm(total, generator=gen)
        width = max(need)
        self.table = torch.zeros(len(seqs_kv), width, dtype=torch.int64)
        used = 0
        for s, (k, v) in enumerate(seqs_kv):
            blocks = order[used : used + need[s]]
            used += need[s]
            self.table[s, : need[s]] = blocks
            pos = torch.arange(k.shape[0])
            self.k[blocks[pos // block_size], pos % block_size] = k
            self.v[blocks[pos // block_size], pos % block_size] = v

    def attend(
        self, kernels, q_parts: list[torch.Tensor], kv_lens: list[int], scale: float, seqs=None
    ) -> torch.Tensor:
        """Sequence i of the call is cache sequence ``seqs[i]`` (default: the first len(q_parts) ones)."""
        q = torch.cat(q_parts)
        cu = _cu([p.shape[0] for p in q_parts])
        lens = torch.tensor(kv_lens, dtype=torch.int64)
        table = self.table[: len(q_parts)] if seqs is None else self.table[list(seqs)]
        return kernels.paged_attention(q, self.k, self.v, table, cu, lens, scale)


def _prefill(kernels, seqs, scale):
    """Full causal prefill of several packed sequences; returns per-sequence outputs."""
    q = torch.cat([s[0] for s in seqs])
    k = torch.cat([s[1] for s in seqs])
    v = torch.cat([s[2] for s in seqs])
    cu = _cu([s[0].shape[0] for s in seqs])
    out = kernels.attention(q, k, v, cu, cu, scale)
    return [out[cu[i] : cu[i + 1]] for i in range(len(seqs))]


def _reference(q, k, v, kv_len: int, scale: float) -> torch.Tensor:
    """float64 bottom-right causal attention for one sequence (GQA by head repetition)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", qd, kd) * scale
    q_pos = kv_len - q.shape[0] + torch.arange(q.shape[0])
    scores = scores.masked_fill(torch.arange(kv_len)[None, :] > q_pos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


shapes = st.fixed_dictionaries(
    {
        "length": st.integers(1, 130),
        "hkv": st.sampled_from([1, 2]),
        "group": st.sampled_from([1, 2, 4]),
        "dqk": st.sampled_from([16, 32, 64]),
        "dv_same": st.booleans(),
        "dtype": st.sampled_from(sorted(DTYPES)),
        "seed": st.integers(0, 2**16),
    }
)


def _draw_slice(data, n: int, like: int, label: str) -> tuple[int, int]:
    """[a, b) of a stranger's n tokens, attended with kv_len = b: its decode row (the last token) or
    a chunk ending anywhere: short (sequences of <= 16 query rows share one group), as long as the
    target's chunk ``like`` (equal q_lens share a group), or any length."""
    if data.draw(st.booleans(), label=f"{label} decodes"):
        return n - 1, n
    b = data.draw(st.integers(1, n), label=f"{label} kv_len")
    q_len = data.draw(st.one_of(st.integers(1, 8), st.just(like), st.integers(1, b)), label=f"{label} q_len")
    return b - min(q_len, b), b


def _mixed_calls(kernels, members, cache: PagedCache, scale: float):
    """Each member ``(cache_seq, (q, k, v), a, b)`` attends its queries ``a:b`` with kv_len ``b``,
    all in one paged call and all packed in one contiguous call; per member (paged, contiguous)."""
    parts = [s[0][a:b] for _, s, a, b in members]
    cu_q, kv_lens = _cu([p.shape[0] for p in parts]), [b for *_, b in members]
    paged = cache.attend(kernels, parts, kv_lens, scale, seqs=[m[0] for m in members])
    k = torch.cat([s[1][:b] for _, s, _, b in members])
    v = torch.cat([s[2][:b] for _, s, _, b in members])
    packed = kernels.attention(torch.cat(parts), k, v, cu_q, _cu(kv_lens), scale)
    cu = cu_q.tolist()
    return [(paged[cu[i] : cu[i + 1]], packed[cu[i] : cu[i + 1]]) for i in range(len(members))]


@settings(max_examples=20, deadline=None)
@given(
    shape=shapes, chunk=st.integers(1, 150), block_size=st.sampled_from([1, 3, 16, 64, 100]), data=st.data()
)
def test_query_bits_same_in_prefill_chunked_decode_and_any_batch(shape, chunk, block_size, data):
    gen = torch.Generator().manual_seed(shape["seed"])
    hkv, hq, dqk, dtype = shape["hkv"], shape["hkv"] * shape["group"], shape["dqk"], DTYPES[shape["dtype"]]
    dv = dqk if shape["dv_same"] else 24
    length = shape["length"]
    scale = dqk**-0.5
    target = _seq(gen, length, hq, hkv, dqk, dv, dtype)
    n_neigh = data.draw(st.integers(1, 3), label="neighbours")
    neigh = [_seq(gen, data.draw(st.integers(1, 90)), hq, hkv, dqk, dv, dtype) for _ in range(n_neigh)]
    alone = _prefill(ALIGNED, [target], scale)[0]
    # packed with strangers, in the middle of the batch
    batched = _prefill(ALIGNED, [neigh[0], target, *neigh[1:]], scale)
    assert torch.equal(alone, batched[1])
    refs = [alone, batched[0], *batched[2:]]  # full-prefill bits of cache sequence i

    cache = PagedCache(gen, [(target[1], target[2])] + [(n[1], n[2]) for n in neigh], block_size)
    chunk = min(chunk, length)
    starts = list(range(0, length, chunk))
    # the whole target is already cached, so any chunk can be replayed on its own; check a few
    picks = sorted(set(data.draw(st.lists(st.sampled_from(starts), min_size=1, max_size=4), label="chunks")))
    for start in picks:
        end = min(length, start + chunk)
        # the target's chunk anywhere in a call where each stranger brings a decode row or a chunk
        # [a, b) of its own (kv_len = b), through the paged (engine) and packed (trainer) entry points
        members = [
            (i + 1, n, *_draw_slice(data, n[0].shape[0], end - start, f"stranger {i}"))
            for i, n in enumerate(neigh)
        ]
        members.insert(data.draw(st.integers(0, n_neigh), label="target slot"), (0, target, start, end))
        for (seq, _, a, b), (paged, packed) in zip(members, _mixed_calls(ALIGNED, members, cache, scale)):
            assert torch.equal(paged, refs[seq][a:b]), (seq, a, b)
            assert torch.equal(packed, refs[seq][a:b]), (seq, a, b)
    # single-token decode of the last position, alone
    assert torch.equal(cache.attend(ALIGNED, [target[0][-1:]], [length], scale)[0], alone[-1])
    # a chunk alone through the trainer entry point (q_len < kv_len, no neighbour): the last drawn
    # chunk, or the second half when one chunk covers the sequence (that would be the prefill itself)
    split = starts[-1] if starts[-1] > 0 else length // 2
    if split > 0:
        tail = ALIGNED.attention(
            target[0][split:], target[1], target[2], _cu([length - split]), _cu([length]), scale
        )
        assert torch.equal(tail, alone[split:])


def _default_breaks(check) -> bool:
    for seed in range(20):
        for length in (37, 64, 100, 129, 200):
            if check(seed, length):
                return True
    return False


def test_default_decode_differs_from_prefill():
    def differs(seed, length):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = _seq(gen, length, 4, 2, 32, 32, torch.float32)
        full = _prefill(DEFAULT, [(q, k, v)], 32**-0.5)[0]
        cache = PagedCache(gen, [(k, v)], 16)
        return not torch.equal(cache.attend(DEFAULT, [q[-1:]], [length], 32**-0.5)[0], full[-1])

    assert _default_breaks(differs)


def test_default_chunked_prefill_differs_from_full_prefill():
    def differs(seed, length):
        # SDPA's CPU kernel agrees with itself for long chunks; a short final chunk exposes it. Which head
        # size shows it is the CPU's: head dim 32 on an AVX-512 Xeon, only 64 on one with AMX (measured)
        for heads, kv_heads, dim in ((4, 2, 32), (8, 2, 64)):
            gen = torch.Generator().manual_seed(seed)
            q, k, v = _seq(gen, length, heads, kv_heads, dim, dim, torch.float32)
            full = _prefill(DEFAULT, [(q, k, v)], dim**-0.5)[0]
            for split in (length // 2, length - 3, length - 2):
                tail = DEFAULT.attention(q[split:], k, v, _cu([length - split]), _cu([length]), dim**-0.5)
                if not torch.equal(tail, full[split:]):
                    return True
        return False

    assert _default_breaks(differs)


def test_default_decode_depends_on_batch_neighbours():
    def differs(seed, length):
        gen = torch.Generator().manual_seed(seed)
        target = _seq(gen, length, 4, 2, 32, 32, torch.float32)
        other = _seq(gen, 300, 4, 2, 32, 32, torch.float32)
        cache = PagedCache(gen, [(target[1], target[2]), (other[1], other[2])], 16)
        alone = cache.attend(DEFAULT, [target[0][-1:]], [length], 32**-0.5)
        with_other = cache.attend(DEFAULT, [target[0][-1:], other[0][-1:]], [length, 300], 32**-0.5)
        return not torch.equal(alone[0], with_other[0])

    assert _default_breaks(differs)


def test_default_mixed_chunk_call_differs_from_prefill():
    """The mixed call of the property test (chunks and a decode row, paged and packed) with the default
    set. Its chunks cannot depend on their neighbours (each multi-query sequence runs alone through
    SDPA), so the break shows in the decode row, which takes the batched decode path in both calls."""

    def differs(seed, length):
        gen = torch.Generator().manual_seed(seed)
        seqs = [_seq(gen, n, 4, 2, 32, 32, torch.float32) for n in (length, 90, 300)]
        refs = _prefill(DEFAULT, seqs, 32**-0.5)
        cache = PagedCache(gen, [(k, v) for _, k, v in seqs], 16)
        members = [(1, seqs[1], 50, 80), (0, seqs[0], length - 5, length), (2, seqs[2], 299, 300)]
        outs = _mixed_calls(DEFAULT, members, cache, 32**-0.5)
        return any(
            not torch.equal(paged, refs[s][a:b]) and not torch.equal(packed, refs[s][a:b])
            for (s, _, a, b), (paged, packed) in zip(members, outs)
        )

    assert _default_breaks(differs)


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_accuracy_against_float64(kernels, dtype):
    """fp32: max |err| <= 1e-5; bf16 (output rounded to bf16): |err| <= 2^-8 |ref| + 1e-3."""
    gen = torch.Generator().manual_seed(0)
    seqs = [_seq(gen, n, 8, 2, 64, 48, DTYPES[dtype]) for n in (1, 63, 64, 65, 200)]
    outs = _prefill(kernels, seqs, 0.125)
    for (q, k, v), out in zip(seqs, outs):
        ref = _reference(q, k, v, q.shape[0], 0.125)
        err = (out.double() - ref).abs()
        if dtype == "fp32":
            assert err.max() <= 1e-5
        else:
            assert bool((err <= 2**-8 * ref.abs() + 1e-3).all())
    # chunked / decode rows too (q_len < kv_len)
    q, k, v = seqs[-1]
    tail = kernels.attention(q[150:], k, v, _cu([50]), _cu([200]), 0.125)
    ref = _reference(q[150:], k, v, 200, 0.125)
    assert (tail.double() - ref).abs().max() <= (1e-5 if dtype == "fp32" else 2e-2)
    # a ragged decode batch over a paged cache (stale slots hold nan)
    cache = PagedCache(gen, [(k, v) for _, k, v in seqs], 16)
    dec = cache.attend(kernels, [q[-1:] for q, _, _ in seqs], [q.shape[0] for q, _, _ in seqs], 0.125)
    for i, (q, k, v) in enumerate(seqs):
        ref = _reference(q[-1:], k, v, q.shape[0], 0.125)
        assert (dec[i : i + 1].double() - ref).abs().max() <= (1e-5 if dtype == "fp32" else 2e-2)


def test_mla_shapes_and_nan_free_stale_cache():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _seq(gen, 70, 4, 4, 96, 64, torch.float32)
    cache = PagedCache(gen, [(k, v)], 32)
    out = cache.attend(ALIGNED, [q[-5:]], [70], 96**-0.5)
    assert out.shape == (5, 4, 64) and bool(torch.isfinite(out).all())
    assert torch.equal(out, _prefill(ALIGNED, [(q, k, v)], 96**-0.5)[0][-5:])


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
def test_autograd_gives_same_bits_and_gradients(kernels):
    """The trainer differentiates through attention: grad mode must not change the forward bits."""
    gen = torch.Generator().manual_seed(5)
    seqs = [_seq(gen, n, 4, 2, 32, 24, torch.float32) for n in (9, 70)]
    with torch.no_grad():
        ref = torch.cat(_prefill(kernels, seqs, 0.2))
    leaves = [[t.clone().requires_grad_() for t in s] for s in seqs]
    out = torch.cat(_prefill(kernels, leaves, 0.2))
    assert torch.equal(out, ref)
    out.square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for s in leaves for t in s)


def test_bad_inputs_raise():
    q, k, v = torch.randn(4, 3, 16), torch.randn(4, 2, 16), torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        ALIGNED.attention(q, k, v, _cu([4]), _cu([4]), 0.25)
    q = torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match="kv_len >= q_len"):
        ALIGNED.attention(q, k[:2], v[:2], _cu([4]), _cu([2]), 0.25)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        ALIGNED.attention(q, k, v, _cu([3]), _cu([4]), 0.25)
