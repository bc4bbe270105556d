"""Row-invariant GEMM: the primitive every aligned op that multiplies matrices uses.

Problem (measured on this CPU, torch 2.13 + MKL 2024.2 + oneDNN 3.12, AVX-512):
``F.linear`` in fp32 goes to MKL sgemm, which picks a different kernel for small M
(M=1 gemv; M=2..3, 5..7 and 9..11 other blockings with 2 threads; M=1..3 with 1
thread), so a row's bits depend on how many rows share the call. M=4, 8 and every
M >= 12 agreed with each other on every shape tried.

Fix used here: call oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``, the op
torch's own CPU compiler backend uses for linear layers) on a batch of at least
``ONEDNN_MIN_ROWS`` rows. oneDNN's brgemm keeps one K-accumulation order per output
element whatever M and N are: in a sweep over M in 1..69 and up to 1024 and 12 shapes
(K, N from 5 to 4096), with 1 and 2 threads, every M >= 2 gave the same bits per row in
fp32 and every M >= 1 in bf16; only fp32 M=1 takes a separate (gemv) path. So fp32 pads
a single row to 2 rows, bf16 pads to 4 rows (margin over the measured 1, matching the
earlier F.linear measurement that bf16 needed >= 4). Column subsets of the weight give
the same bits too (column-parallel layout invariance) for every width N >= 2; an fp32
single output column (N=1) is again a gemv, so a 1-row weight is padded to 2 rows.
Padding rows are zeros; rows never interact in a GEMM, so padding only selects the kernel.

Fallback when oneDNN is absent or for other dtypes (fp64, fp16): ``F.linear`` with the
row count padded up to a multiple of ``FALLBACK_MIN_ROWS`` = 16. Padding only to "at least
16" is not enough: MKL dgemm (fp64) gave different bits for every M not a multiple of 4,
also above 16, and for odd K a row's bits depended on whether it started 16-byte aligned.
So the fallback copies x into a fresh buffer with M rounded up to a multiple of 16 and a
row stride that is a multiple of 16 elements; that agreed in fp64, fp32 and fp16 for every
M and row position tried. Slower for small M (M=1 ~5x).

These are empirical facts about this library build, not guarantees of the libraries;
tests/kernels/test_dense_invariance.py re-checks them with hypothesis on every run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: rows a oneDNN call is padded up to, per dtype (see module docstring for the measurements)
ONEDNN_MIN_ROWS = {torch.float32: 2, torch.bfloat16: 4}
#: output columns (weight rows) a oneDNN call is padded up to: a single output column is
#: a separate (gemv) path in fp32, every N >= 2 gave the same bits per column
ONEDNN_MIN_COLS = 2
#: an F.linear (MKL) call's row count is padded up to a multiple of this when oneDNN cannot be used
FALLBACK_MIN_ROWS = 16
#: kept for callers of the first version of this module
MIN_ROWS = FALLBACK_MIN_ROWS


def _onednn_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without mkldnn
        return False


_ONEDNN = _onednn_available()


def _pad_rows(x2d: torch.Tensor, rows: int) -> torch.Tensor:
    padded = x2d.new_zeros(rows, x2d.shape[1])
    padded[: x2d.shape[0]] = x2d
    return padded


def _check(x2d: torch.Tensor, weight: torch.Tensor) -> None:
    if x2d.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"row_invariant_linear needs x2d [M, K] and weight [N, K], "
            f"got {tuple(x2d.shape)}, {tuple(weight.shape)}"
        )
    if x2d.shape[1] != weight.shape[1]:
        raise ValueError(f"inner dims differ: x2d {tuple(x2d.shape)} vs weight {tuple(weight.shape)}")
    if x2d.dtype != weight.dtype:
        raise TypeError(f"x2d dtype {x2d.dtype} != weight dtype {weight.dtype}")


def uses_onednn(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """Whether ``row_invariant_linear`` takes the oneDNN path for this dtype/device."""
    return _ONEDNN and torch.device(device).type == "cpu" and dtype in ONEDNN_MIN_ROWS


def _onednn_forward(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    m, n = x2d.shape[0], weight.shape[0]
    rows = ONEDNN_MIN_ROWS[x2d.dtype]
    if m < rows:
        x2d = _pad_rows(x2d, rows)
    if n < ONEDNN_MIN_COLS:
        weight = _pad_rows(weight, ONEDNN_MIN_COLS)
    out = torch.ops.mkldnn._linear_pointwise(x2d, weight, None, "none", [None], "")
    return out[:m, :n] if (m < rows or n < ONEDNN_MIN_COLS) else out


class _OneDNNLinear(torch.autograd.Function):
    """oneDNN's op has no autograd formula (backprop through it silently gives no grads),
    so the backward is written out. Gradients need no row invariance: only the forward
    logprobs are compared between engine and trainer."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x2d, weight)
        return _onednn_forward(x2d, weight)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2d, weight = ctx.saved_tensors
        grad_x = grad_out.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad_out.t().mm(x2d) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def row_invariant_linear(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x2d [M, K] @ weight[N, K].T`` with row i's bits independent of M and of other rows.

    Also independent of which output columns are requested (a column slice of ``weight``
    gives the same bits as slicing the full result), so column-parallel sharding is free.
    Differentiable (plain GEMM backward).
    """
    _check(x2d, weight)
    m = x2d.shape[0]
    if m == 0:
        return x2d.new_zeros(0, weight.shape[0]) + weight.sum() * 0
    x2d = x2d.contiguous()
    weight = weight.contiguous()
    if _ONEDNN and x2d.dtype in ONEDNN_MIN_ROWS and x2d.device.type == "cpu":
        if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad):
            return _OneDNNLinear.apply(x2d, weight)
        return _onednn_forward(x2d, weight)
    return _mkl_fallback(x2d, weight)


def _mkl_fallback(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # always a fresh (allocator-aligned) buffer whose row stride is a multiple of 16 elements:
    # MKL dgemm picks a different kernel for rows that start misaligned (odd K, odd row)
    m, k = x2d.shape
    rows = -(-m // FALLBACK_MIN_ROWS) * FALLBACK_MIN_ROWS
    stride = -(-k // FALLBACK_MIN_ROWS) * FALLBACK_MIN_ROWS
    buf = x2d.new_zeros(rows, stride)
    buf[:m, :k] = x2d
    return F.linear(buf[:, :k], weight)[:m]
