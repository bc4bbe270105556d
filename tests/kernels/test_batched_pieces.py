"""Small fp32 K-pieces in one batched GEMM (``gemm.batched_pieces``): exact invariance, and its inverse.

The aligned row-parallel linear multiplies ``virtual_shards`` K-pieces. For small fp32 pieces it
runs them as one ``torch.bmm`` with rows padded to ``BATCHED_MIN_ROWS`` (oneDNN's per-call cost
dominates there). Layout invariance needs every (piece, row) to get the same bits whatever the
row count M, the row's position, and how many pieces share the call (TP 1 computes 4 pieces in a
call, TP 2 two per rank, TP 4 one). Checked with ``torch.equal`` at 1 and 2 threads. Inverse: the
same batched GEMM without the row padding gives a row different bits at some M.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import torch_threads as _threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.aligned import gemm

ALIGNED = get_kernels("aligned")


def _randn(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 40),
    piece_k=st.sampled_from([8, 16, 33, 64, 96, 128]),
    n=st.integers(gemm.BATCHED_MIN_COLS, 256),
    seed=st.integers(0, 2**16),
)
def test_every_row_and_piece_is_independent_of_m_position_and_piece_count(threads, m, piece_k, n, seed):
    x, w = _randn((m + 7, 4 * piece_k), seed), _randn((n, 4 * piece_k), seed + 1)
    with _threads(threads), torch.no_grad():
        full = gemm.batched_pieces(x, w, 4)  # [4, M + 7, N]
        for lo, hi in ((0, m), (7, m + 7), (3, 4)):
            rows = x[lo:hi]
            assert torch.equal(gemm.batched_pieces(rows, w, 4), full[:, lo:hi])
            for first, count in ((0, 2), (2, 2), (3, 1)):  # a TP 2 rank's pieces, a TP 4 rank's piece
                cols = slice(first * piece_k, (first + count) * piece_k)
                part = gemm.batched_pieces(rows[:, cols], w[:, cols], count)
                assert torch.equal(part, full[first : first + count, lo:hi])


def test_narrow_outputs_would_not_be_row_invariant():
    """Why N >= 16: a padded batched GEMM with 2 output columns gave some rows other bits."""
    x, w = _randn((47, 32), 0), _randn((2, 32), 1)
    full = gemm.batched_pieces(x, w, 4)
    assert any(not torch.equal(gemm.batched_pieces(x[:m], w, 4), full[:, :m]) for m in range(1, 40))


def test_unpadded_batched_gemm_is_not_row_invariant():
    """Inverse: the padding is what makes it invariant (a single row takes another kernel)."""
    differs = 0
    for seed, (piece_k, n) in enumerate([(32, 128), (64, 128), (64, 256), (128, 128), (96, 200)]):
        x, w = _randn((40, 4 * piece_k), seed), _randn((n, 4 * piece_k), seed + 100)
        weight_pieces = w.unflatten(1, (4, piece_k)).permute(1, 2, 0)
        full = torch.bmm(x.reshape(40, 4, piece_k).transpose(0, 1).contiguous(), weight_pieces)
        for m in range(1, 16):
            alone = torch.bmm(x[:m].reshape(m, 4, piece_k).transpose(0, 1).contiguous(), weight_pieces)
            differs += not torch.equal(alone, full[:, :m])
    assert differs > 0


def test_autograd_path_gives_the_same_bits_and_gradients():
    x, w = _randn((5, 256), 0).requires_grad_(), _randn((96, 256), 1).requires_grad_()
    with torch.no_grad():
        plain = gemm.batched_pieces(x, w, 4)
    traced = gemm.batched_pieces(x, w, 4)
    assert torch.equal(traced.detach(), plain)
    traced.sum().backward()
    # d/dx of sum over pieces of x_j W_j^T is the column sums of W (tolerance: fp32 summation)
    assert torch.allclose(x.grad, w.sum(0).expand(5, -1), rtol=1e-5, atol=1e-5)
    assert torch.allclose(w.grad, x.sum(0).expand(96, -1), rtol=1e-5, atol=1e-5)


def test_kernel_choice_depends_on_piece_shape_and_dtype_only():
    limit = gemm.BATCHED_PIECE_MAX_ELEMENTS
    assert gemm.uses_batched_pieces(64, limit // 64, torch.float32)
    assert not gemm.uses_batched_pieces(64, limit // 64 + 1, torch.float32)
    assert not gemm.uses_batched_pieces(8, 8, torch.float32)  # narrow outputs: not row-invariant
    assert not gemm.uses_batched_pieces(8, 16, torch.bfloat16)


def test_row_parallel_linear_uses_it_and_matches_float64():
    x, w = _randn((9, 256), 2), _randn((128, 256), 3)
    assert gemm.uses_batched_pieces(256 // 4, 128, torch.float32)
    out = ALIGNED.row_parallel_linear(x, w)
    reference = (x.double() @ w.double().T).float()
    # fp32 accumulation over K = 256 in four pieces: relative error well under 1e-5 of the row scale
    assert torch.allclose(out, reference, rtol=1e-5, atol=1e-4)
    for i in range(9):
        assert torch.equal(ALIGNED.row_parallel_linear(x[i : i + 1], w)[0], out[i])


def test_indivisible_pieces_are_one_clear_error():
    with pytest.raises(ValueError, match="not divisible into 3 pieces"):
        gemm.row_invariant_pieces(_randn((2, 8), 0), _randn((4, 8), 1), 3)
