"""The aligned-native set's C attention: bitwise invariance by construction, accuracy, build.

Invariance tests compare with ``torch.equal``: a query's output in a packed full prefill, in a
paged chunked prefill and in a paged decode step (shuffled blocks, nan in unused slots, other
sequences in the call), at 1 and 2 threads, and from an ``-O0`` build against the vectorized
``-O3 -march=native`` one (SSE2 code against AVX-512 code here). The inverse (the default set
breaks phase invariance) is tests/kernels/test_attention.py's; here the contrast is that the
pure-torch aligned set computes different bits, so the two sets must never be mixed between
engine and trainer. Accuracy is against float64 with stated tolerances.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import torch_threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import NativeKernels, _build

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()  # builds the library on first use, not at import
ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)


def _make(gen, lens, hq, hkv, dqk, dv, dtype):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return [(rnd(n, hq, dqk), rnd(n, hkv, dqk), rnd(n, hkv, dv)) for n in lens]


def _paged(gen, seqs, block):
    """A cache holding every sequence's K/V in shuffled blocks; unused slots hold nan."""
    need = [-(-q.shape[0] // block) for q, _, _ in seqs]
    total = sum(need) + 2
    k0, v0 = seqs[0][1], seqs[0][2]
    kc = torch.full((total, block, *k0.shape[1:]), float("nan"), dtype=k0.dtype)
    vc = torch.full((total, block, *v0.shape[1:]), float("nan"), dtype=v0.dtype)
    order = torch.randperm(total, generator=gen)
    table = torch.zeros(len(seqs), max(need), dtype=torch.int64)
    used = 0
    for s, (_, k, v) in enumerate(seqs):
        blocks = order[used : used + need[s]]
        used += need[s]
        table[s, : need[s]] = blocks
        pos = torch.arange(k.shape[0])
        kc[blocks[pos // block], pos % block] = k
        vc[blocks[pos // block], pos % block] = v
    return kc, vc, table


def _prefill(kernels, seqs, scale):
    q, k, v = (torch.cat([s[i] for s in seqs]) for i in range(3))
    cu = _cu([s[0].shape[0] for s in seqs])
    return kernels.attention(q, k, v, cu, cu, scale)


def _paged_steps(kernels, seqs, kc, vc, table, chunk, scale):
    """All sequences advanced together in chunks of ``chunk`` queries (1 = decode steps)."""
    lens = [s[0].shape[0] for s in seqs]
    outs = [[] for _ in seqs]
    done = [0] * len(seqs)
    while any(d < n for d, n in zip(done, lens)):
        live = [i for i in range(len(seqs)) if done[i] < lens[i]]
        parts = [seqs[i][0][done[i] : min(lens[i], done[i] + chunk)] for i in live]
        kv = torch.tensor([done[i] + p.shape[0] for i, p in zip(live, parts)])
        out = kernels.paged_attention(
            torch.cat(parts), kc, vc, table[live], _cu([p.shape[0] for p in parts]), kv, scale
        )
        at = 0
        for i, p in zip(live, parts):
            outs[i].append(out[at : at + p.shape[0]])
            at += p.shape[0]
            done[i] += p.shape[0]
    return torch.cat([torch.cat(o) for o in outs])


@settings(max_examples=40, deadline=None)
@given(
    hkv=st.integers(1, 3),
    group=st.integers(1, 4),
    # whole-chunk head dims (Dqk % 16 == 0 and Dv % 64 == 0) take attention.c's specialised loops
    dqk=st.one_of(st.integers(1, 80), st.sampled_from([16, 64])),
    dv=st.one_of(st.integers(1, 80), st.just(64)),
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    chunk=st.integers(1, 9),
    block=st.integers(1, 20),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_prefill_chunked_and_decode_are_bitwise_equal(hkv, group, dqk, dv, lens, chunk, block, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    seqs = _make(gen, lens, hkv * group, hkv, dqk, dv, DTYPES[dtype])
    scale = dqk**-0.5
    full = _prefill(NATIVE, seqs, scale)
    kc, vc, table = _paged(gen, seqs, block)
    assert torch.equal(_paged_steps(NATIVE, seqs, kc, vc, table, chunk, scale), full)
    assert torch.equal(_paged_steps(NATIVE, seqs, kc, vc, table, 1, scale), full)
    # each sequence alone gives the bits it got among the others
    at = 0
    for s in seqs:
        n = s[0].shape[0]
        assert torch.equal(_prefill(NATIVE, [s], scale), full[at : at + n])
        at += n


def test_thread_count_and_views_do_not_change_bits():
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, n = 8, 2, 64, 70
    # q, k, v as strided views of one fused projection, as the models produce them
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen)
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(n, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(n, hkv, d)
    assert not q.is_contiguous()
    cu = _cu([n])
    with torch_threads(1):
        one = NATIVE.attention(q, k, v, cu, cu, 0.125)
    with torch_threads(2):
        two = NATIVE.attention(q, k, v, cu, cu, 0.125)
    assert torch.equal(one, two)
    assert torch.equal(one, NATIVE.attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, 0.125))
    # a lazily negated view (storage holds the un-negated values) is read as its values
    lazy_k = torch._neg_view(-k.contiguous())  # values k, contiguous storage holding -k
    assert lazy_k.is_neg() and torch.equal(NATIVE.attention(q, lazy_k, v, cu, cu, 0.125), one)


@pytest.mark.parametrize("dqk, dv", [(72, 40), (64, 64), (32, 128)])  # generic and whole-chunk loops
def test_O0_build_gives_the_same_bits(monkeypatch, dqk, dv):
    """The bits follow from the source alone: an unoptimized build for the baseline target (SSE2,
    no auto-vectorization) agrees with the -O3 -march=native one (AVX-512 here)."""
    gen = torch.Generator().manual_seed(4)
    for dtype in DTYPES.values():
        seqs = _make(gen, [33, 5, 17], 6, 2, dqk, dv, dtype)
        vectorized = _prefill(NATIVE, seqs, 0.1)
        monkeypatch.setattr(_build, "build_flags", ("-O0",))
        scalar = _prefill(NATIVE, seqs, 0.1)
        monkeypatch.undo()
        assert torch.equal(vectorized, scalar)
        # nan scores too, byte for byte (0 * inf: the negative default nan, in a key block)
        for q, k, _ in seqs:
            _plant(q, k, "zero-times-inf")
        vectorized = _prefill(NATIVE, seqs, 0.1)
        monkeypatch.setattr(_build, "build_flags", ("-O0",))
        scalar = _prefill(NATIVE, seqs, 0.1)
        monkeypatch.undo()
        assert vectorized.isnan().any() and torch.equal(_bytes(vectorized), _bytes(scalar))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_whole_chunk_loops_give_the_generic_loops_bits(dtype):
    """attention.c runs head dims in whole chunks (Dqk % 16 == 0, Dv % 64 == 0) through its own
    loops. Widening V by 16 columns sends the same call through the generic loops, where each output
    column is computed alone: the first Dv columns must keep every bit, nan and inf included. In bf16
    the prefill items (>= 16 query rows) read K/V widened to fp32 once per item and the decode steps
    read bf16 rows directly: the two must agree too."""
    gen = torch.Generator().manual_seed(5)
    seqs = _make(gen, [40, 1, 23], 8, 2, 64, 64, DTYPES[dtype])
    q0, k0, v0 = seqs[0]
    k0[3, 1, 5], v0[7, 0, 9], v0[11, 1, 63] = float("inf"), float("nan"), -float("inf")
    extra = [torch.randn(*v.shape[:2], 16, generator=gen).to(v.dtype) for _, _, v in seqs]
    wide = [(q, k, torch.cat([v, e], -1)) for (q, k, v), e in zip(seqs, extra)]
    whole = _prefill(NATIVE, seqs, 0.125)
    generic = _prefill(NATIVE, wide, 0.125)[..., :64]
    assert torch.equal(whole.isnan(), generic.isnan())
    assert torch.equal(whole.nan_to_num(), generic.nan_to_num())
    kc, vc, table = _paged(gen, seqs, 16)
    wkc, wvc, wtable = _paged(torch.Generator().manual_seed(6), wide, 16)
    decode = _paged_steps(NATIVE, seqs, kc, vc, table, 1, 0.125)
    wide_decode = _paged_steps(NATIVE, wide, wkc, wvc, wtable, 1, 0.125)[..., :64]
    assert torch.equal(decode.nan_to_num(), whole.nan_to_num())
    assert torch.equal(wide_decode.nan_to_num(), whole.nan_to_num())


SPECIAL_SCORES = ["random", "zero-scores", "equal-keys", "inf-key", "neg-inf-score", "all-neg-inf", "nan-key",
                  "zero-times-inf"]  # fmt: skip


def _plant(q, k, special):
    """Scores of one kind in every sequence (q and k changed in place)."""
    last = k.shape[0] - 1
    if special == "zero-scores":  # ties at the maximum, +0
        q[5:] = 0.0
    elif special == "equal-keys":
        k[:] = k[:1]
    elif special == "inf-key":  # an infinite maximum: inf - inf makes the row nan
        q[..., 3] = 1.0
        k[min(14, last), 0, 3] = float("inf")
    elif special in ("neg-inf-score", "all-neg-inf"):  # -inf scores under a finite maximum, or only those
        q[..., 3] = 1.0
        k[(slice(None) if special == "all-neg-inf" else min(9, last)), :, 3] = -float("inf")
    elif special == "nan-key":
        k[last, 0, 7] = float("nan")
    elif special == "zero-times-inf":  # the x86 default nan (negative) as a score, in a block and in the tail
        q[..., 5] = 0.0
        k[min(3, last), 1, 5] = float("inf")
        k[last, 0, 5] = -float("inf")


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("special", SPECIAL_SCORES)
def test_key_blocks_give_the_one_key_loops_bits(dtype, special):
    """The whole-chunk loops score keys 16 at a time (lanes_tree16, a vector maximum, zm_exp16); the
    generic loops (reached by widening V past whole chunks) score one key at a time. Every query row
    must get the same bytes -- a nan's sign and payload included -- at block edges (15, 16, 17, 32, 33
    keys) and where the maximum is tied, infinite, -inf throughout, or a nan (the last nan score is
    attend_row's maximum; 0 * inf gives the negative default nan)."""
    gen = torch.Generator().manual_seed(11)
    seqs = _make(gen, [15, 16, 17, 32, 33], 4, 2, 64, 64, DTYPES[dtype])
    for q, k, _ in seqs:
        _plant(q, k, special)
    extra = [torch.randn(*v.shape[:2], 16, generator=gen).to(v.dtype) for _, _, v in seqs]
    wide = [(q, k, torch.cat([v, e], -1)) for (q, k, v), e in zip(seqs, extra)]
    for run in (_prefill, lambda kernels, s, scale: _paged_steps(kernels, s, *_paged(gen, s, 16), 1, scale)):
        whole = run(NATIVE, seqs, 0.125)
        generic = run(NATIVE, wide, 0.125)[..., :64]
        assert torch.equal(_bytes(whole), _bytes(generic))
        assert whole.isnan().any() == (special in ("inf-key", "all-neg-inf", "nan-key", "zero-times-inf"))


def test_native_and_pure_torch_aligned_bits_differ():
    """Two different fixed orders: engine and trainer must run the same set (the contrast)."""
    gen = torch.Generator().manual_seed(5)
    seqs = _make(gen, [50, 20], 8, 2, 64, 64, torch.float32)
    native, aligned = _prefill(NATIVE, seqs, 0.125), _prefill(ALIGNED, seqs, 0.125)
    assert not torch.equal(native, aligned)
    assert (native - aligned).abs().max() < 1e-5


def _reference(q, k, v, scale):
    """float64 causal attention of one full sequence (GQA by head repetition)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", qd, kd) * scale
    n = q.shape[0]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


@pytest.mark.parametrize(
    "dtype, magnitude, tol",
    [(torch.float32, 1.0, 2e-6), (torch.float32, 30.0, 5e-5), (torch.bfloat16, 1.0, 2e-2)],
)
def test_accuracy_against_float64(dtype, magnitude, tol):
    """Tolerances: fp32 math on fp32 inputs; at magnitude 30 the scores reach ~+-300, where one
    fp32 rounding of a score is ~2e-5 absolute in the exponent (the pure-torch aligned set's
    error on the same input is printed for comparison); bf16 outputs are one bf16 rounding
    (2^-8 relative) of values <= ~4."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(90, h, 48, generator=gen).to(dtype) for h in (6, 3, 3))
    q = q * magnitude
    cu, scale = _cu([90]), 48**-0.5
    out = NATIVE.attention(q, k, v, cu, cu, scale)
    assert out.dtype == dtype
    reference = _reference(q, k, v, scale)
    native_error = (out.double() - reference).abs().max()
    aligned_error = (ALIGNED.attention(q, k, v, cu, cu, scale).double() - reference).abs().max()
    print(f"max abs error vs float64: native {native_error:.3g}, pure-torch aligned {aligned_error:.3g}")
    assert native_error < tol


def test_gradients_match_float64():
    """The written-out backward (attention_backward.py) against float64 autograd (tolerance: fp32
    accumulation over 40 keys)."""
    gen = torch.Generator().manual_seed(7)
    base = [torch.randn(40, h, 32, generator=gen) for h in (4, 2, 2)]
    cu = _cu([40])
    ours = [t.clone().requires_grad_() for t in base]
    NATIVE.attention(*ours, cu, cu, 0.2).square().sum().backward()
    ref = [t.double().requires_grad_() for t in base]
    _reference(*ref, 0.2).square().sum().backward()
    for a, b in zip(ours, ref):
        assert (a.grad.double() - b.grad).abs().max() < 1e-4
    # only some inputs needing a gradient
    q = base[0].clone().requires_grad_()
    NATIVE.attention(q, base[1], base[2], cu, cu, 0.2).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_varlen_gradients_are_the_aligned_ops(dtype, tol):
    """Several sequences, queries shorter than keys (bottom-right aligned, as a chunked prefill),
    an empty sequence and a KV head shared by three query heads: the written-out gradient against
    autograd through the pure-torch aligned attention, relative to the largest gradient."""
    gen = torch.Generator().manual_seed(17)
    q_lens, k_lens = [5, 0, 9, 3], [5, 0, 14, 8]
    q = torch.randn(sum(q_lens), 6, 16, generator=gen).to(dtype)
    k, v = (torch.randn(sum(k_lens), 2, 16, generator=gen).to(dtype) for _ in range(2))
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    grads = []
    for kernels in (NATIVE, ALIGNED):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = kernels.attention(*leaves, cu_q, cu_k, 0.25)
        (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads.append([t.grad for t in leaves])
    for native, aligned in zip(*grads, strict=True):
        assert native.dtype == dtype
        scale = aligned.float().abs().max()
        assert ((native.float() - aligned.float()).abs().max() / scale) < tol


def test_bad_inputs_give_one_clear_error():
    gen = torch.Generator().manual_seed(8)
    ((q, k, v),) = _make(gen, [6], 4, 2, 16, 16, torch.float32)
    kc, vc, table = _paged(gen, [(q, k, v)], 4)
    with pytest.raises(ValueError, match="block ids outside"):
        NATIVE.paged_attention(q, kc, vc, table + 100, _cu([6]), torch.tensor([6]), 0.25)
    with pytest.raises(ValueError, match="block ids outside"):
        NATIVE.paged_attention(q, kc, vc, table - 100, _cu([6]), torch.tensor([6]), 0.25)
    # only the blocks a query reaches are checked (the kernel reads no other): a padded table row
    # may hold anything past the sequence's last block
    padded = torch.cat([table, torch.full((table.shape[0], 1), 10**6, dtype=table.dtype)], dim=1)
    out = NATIVE.paged_attention(q, kc, vc, padded, _cu([6]), torch.tensor([6]), 0.25)
    assert torch.equal(out, NATIVE.paged_attention(q, kc, vc, table, _cu([6]), torch.tensor([6]), 0.25))
    with pytest.raises(ValueError, match="kv_len >= q_len"):
        NATIVE.paged_attention(q, kc, vc, table, _cu([6]), torch.tensor([5]), 0.25)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        NATIVE.attention(q[:, :3], k, v, _cu([6]), _cu([6]), 0.25)


def test_edge_inputs_behave_like_the_aligned_set():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(4, h, 8, generator=gen) for h in (2, 1, 1))
    cu = _cu([4])
    # a nan in a key reaches the output (a finite forward over nan keys would hide a blow-up)
    k_nan = k.clone()
    k_nan[1, 0, 0] = float("nan")
    native, aligned = NATIVE.attention(q, k_nan, v, cu, cu, 1.0), ALIGNED.attention(q, k_nan, v, cu, cu, 1.0)
    assert torch.equal(native.isnan(), aligned.isnan()) and native[1:].isnan().all()
    # no tokens at all
    empty, no_seq = torch.zeros(0, 2, 8), torch.tensor([0, 0])
    assert NATIVE.attention(empty, empty[:, :1], empty[:, :1], no_seq, no_seq, 1.0).shape == (0, 2, 8)
    # keys and values of different dtypes (the contract allows it); prefill == decode still holds
    k16 = k.bfloat16()
    full = NATIVE.attention(q, k16, v, cu, cu, 1.0)
    kc, vc = k16.view(1, 4, 1, 8), v.view(1, 4, 1, 8)
    last = NATIVE.paged_attention(q[3:], kc, vc, torch.tensor([[0]]), _cu([1]), torch.tensor([4]), 1.0)
    assert torch.equal(last, full[3:])
    with pytest.raises(ValueError, match="CPU only"):
        NATIVE.attention(q, k, v.to("meta"), cu, cu, 1.0)
    # the index tensors too: the block table is read by the C kernel itself
    table, cu1, kv4 = torch.tensor([[0]]), _cu([1]), torch.tensor([4])
    for args in ((table.to("meta"), cu1, kv4), (table, cu1.to("meta"), kv4), (table, cu1, kv4.to("meta"))):
        with pytest.raises(ValueError, match="CPU only"):
            NATIVE.paged_attention(q[3:], kc, vc, *args, 1.0)
    with pytest.raises(ValueError, match="CPU only"):
        NATIVE.attention(q, k, v, cu.to("meta"), cu, 1.0)
    with pytest.raises(ValueError, match="kv_lens must be >= 0"):
        NATIVE.paged_attention(q[:0], kc, vc, torch.tensor([[0]]), _cu([0]), torch.tensor([-3]), 1.0)


def test_double_backward_is_an_error_not_a_silent_zero():
    q = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 1, 5, dtype=torch.float64)
    cu = _cu([3])
    # refused as soon as a backward builds a graph (create_graph=True), whatever the loss
    for loss in (
        NATIVE.attention(q, k, k, cu, cu, 1.0).pow(2).sum(),
        NATIVE.attention(q, k, k, cu, cu, 1.0).sum(),
    ):
        with pytest.raises(RuntimeError, match="no double backward"):
            torch.autograd.grad(loss, q, create_graph=True)


def test_missing_compiler_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-zm")
    monkeypatch.setenv("ZEROMISMATCH_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(_build, "_loaded", {})
    with pytest.raises(_build.NativeBuildError, match="no-such-compiler-zm"):
        _build.library()
    with pytest.raises(_build.NativeBuildError, match="forbids"):
        _build.library(("-O2", "-ffast-math"))
    with pytest.raises(_build.NativeBuildError, match="forbids"):
        _build.library(("-O2", "-ffp-contract=fast"))
    monkeypatch.setenv("CC", "true")  # "succeeds" without writing a library
    with pytest.raises(_build.NativeBuildError, match="wrote no library"):
        _build.library()
    assert not list(tmp_path.rglob("*.so"))  # no empty library cached, no temp file left


def test_run_provenance_names_the_native_build():
    from zeromismatch._provenance import provenance

    NATIVE.attention(*(torch.randn(3, 2, 4) for _ in range(3)), _cu([3]), _cu([3]), 0.5)  # loads it
    builds = provenance()["numerics"]["native_builds"]
    assert any("-ffp-contract=off -fno-fast-math" in b["flags"] and b["compiler"] for b in builds)
