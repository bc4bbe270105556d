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
(K, N from 5 to 4096), with 1 and 2 threads, every M >= 2 gave the same bits per row;
M = 1 takes a separate (gemv-like) path for some shapes, in fp32 often and in bf16 rarely
(4 of 150 random shapes up to K=4096, N=8192, e.g. 4096x3072; M = 2 and 3 matched in all
150). So both dtypes pad a single row to 2 rows. Column subsets of the weight give
the same bits too (column-parallel layout invariance) for every width N >= 2; an fp32
single output column (N=1) is again a gemv, so a 1-row weight is padded to 2 rows.
Padding rows are zeros; rows never interact in a GEMM, so padding only selects the kernel.

Prepacked weights (speed only, same bits): with a plain ``[N, K]`` weight, every oneDNN call
first reorders the whole weight into its blocked layout (at K = N = 1024 fp32 that reorder is
most of a small-M call). ``packed_weight`` keeps the reordered copy
(``torch.ops.mkldnn._reorder_linear_weight``, as torch's CPU compiler does after freezing)
while the weight is unchanged, and the GEMM is then called with it. The primitive is the same
(``brg_matmul``) and reorders a packed weight it does not expect, so packed and plain give
identical bits: measured for every M in a 14-value sweep, 12 shapes, fp32/bf16, 1 and 2
threads (with the padding above), and re-checked by tests/kernels/test_dense_invariance.py.
Staleness, the byte budget and what is never cached: ``kernels/weight_cache.py``.

Fallback when oneDNN is absent or for other dtypes (fp64, fp16): ``F.linear`` with the
row count padded up to a multiple of ``FALLBACK_MIN_ROWS`` = 16. Padding only to "at least
16" is not enough: MKL dgemm (fp64) gave different bits for every M not a multiple of 4,
also above 16, and for odd K a row's bits depended on whether it started 16-byte aligned.
So the fallback copies x into a fresh buffer with M rounded up to a multiple of 16 and a
row stride that is a multiple of 16 elements; that agreed in fp64, fp32 and fp16 for every
M and row position tried. Slower for small M (M=1 ~5x).

Small K-pieces (the row-parallel virtual shards of tiny models): a oneDNN call costs ~10 us
before it multiplies anything (measured: ``[32, 64] x [64, 128]`` 17.8 us vs 8.0 us for
``F.linear``), and a row-parallel linear makes one call per piece. So fp32 pieces whose weight
piece has at most ``BATCHED_PIECE_MAX_ELEMENTS`` elements and at least ``BATCHED_MIN_COLS`` = 16
output columns are multiplied in one batched MKL GEMM
(``torch.bmm``, ``[pieces, rows, K/V] x [pieces, K/V, N]``) with rows padded up to
``BATCHED_MIN_ROWS`` = 16, the rule the aligned attention's batched GEMMs already follow.
Measured (1 and 2 threads, 9 piece shapes, M 1..70 at three row offsets, 1, 2 or 4 pieces per
call, weight read as a strided view or a contiguous copy): every padded call gave each
(piece, row) the same bits; without padding 405 of 5670 comparisons differed. Narrow outputs
did not: N < 16 took another kernel at some M for a few shapes (K/V = 33 with N <= 9; 8 x 2,
4 x 4, 2 x 12), while N >= 16 passed 325 shapes with K/V from 1 to 65 and ~100 random ones. The choice
depends on the weight piece's shape and dtype only, so every M, every TP degree and the
trainer's autograd path take the same kernel. Crossover (oneDNN pieces time / batched time,
geomean over M in 1..512): 1.15-1.24 at 32768 elements, 0.92-0.98 at 65536.

These are empirical facts about this library build, not guarantees of the libraries;
tests/kernels/test_dense_invariance.py re-checks them with hypothesis on every run.

Portable mode (``ZEROMISMATCH_GEMM_TILE_ROWS=8`` or ``16``, or ``set_gemm_tile_rows``; off by
default): the facts above did not carry over to another machine. On an Intel Xeon (AMX) with torch
2.11 / oneDNN 3.10.2 the fp32 and bf16 aligned GEMMs were not row-invariant, and on an H200 cuBLAS
picks its kernel by M (results/reproduced/portability/). Both libraries did keep a row's bits
when *every* call had the same shape: T-row tiles (T = 4, 8, 16) through packed oneDNN (fp32 and
bf16, 1/4/16 threads, bits independent of the thread count) and through cuBLAS ``F.linear``. In
this mode every GEMM call gets exactly T rows (the batch is cut into T-row tiles, the last one
zero-padded), and the small fp32 K-pieces use per-piece oneDNN tiles instead of the batched MKL
GEMM. On the CI CPU its bits equal the default mode's except for those small fp32 pieces (the
row-parallel o_proj/down_proj of the tiny models); it costs speed, mostly by padding M < T rows to
a full tile (docs/parity.md, "Portability"). Column slices of the weight (column-parallel shards)
are still calls of another shape, which fp32 cuBLAS computes differently. Engine and trainer must
run in the same mode.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

# the cache's entry points stay importable from here, where they were first defined
from ..weight_cache import (  # noqa: F401
    _PACKED,
    BUDGET_ENV,
    cached_from_weight,
    cached_from_weights,
    clear_packed_weights,
    packed_weights,
)


def _onednn_has_bf16() -> bool:
    """oneDNN's bf16 inner product needs avx512bw/vl/dq or avx_ne_convert; on other CPUs (an AMD
    EPYC with AVX2 only, measured) ``_reorder_linear_weight`` and ``_linear_pointwise`` raise."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without mkldnn
        return False


#: rows a oneDNN call is padded up to, per dtype (see module docstring for the measurements); a
#: dtype absent here takes the padded F.linear fallback (bf16 where oneDNN has no bf16 kernels)
ONEDNN_MIN_ROWS = {torch.float32: 2, **({torch.bfloat16: 2} if _onednn_has_bf16() else {})}
#: output columns (weight rows) a oneDNN call is padded up to: a single output column is
#: a separate (gemv) path in fp32, every N >= 2 gave the same bits per column
ONEDNN_MIN_COLS = 2
#: an F.linear (MKL) call's row count is padded up to a multiple of this when oneDNN cannot be used
FALLBACK_MIN_ROWS = 16
#: fp32 K-pieces whose weight piece ``[N, K/V]`` has at most this many elements use one batched GEMM
BATCHED_PIECE_MAX_ELEMENTS = 32768
#: ... and at least this many output columns (narrower ones are not row-invariant; see the docstring)
BATCHED_MIN_COLS = 16
#: rows of that batched GEMM are padded up to this (batched fp32 MKL matmul: >= 16 rows, row-invariant)
BATCHED_MIN_ROWS = 16
#: kept for callers of the first version of this module
MIN_ROWS = FALLBACK_MIN_ROWS
#: environment variable that turns on the portable fixed-tile mode (rows per GEMM call; 0 = off)
TILE_ROWS_ENV = "ZEROMISMATCH_GEMM_TILE_ROWS"


def _tile_rows_from_env() -> int:
    raw = os.environ.get(TILE_ROWS_ENV, "0").strip() or "0"
    try:
        rows = int(raw)
    except ValueError:
        raise ValueError(f"{TILE_ROWS_ENV} must be 0 (off) or a row count >= 2, got {raw!r}") from None
    _check_tile_rows(rows)
    return rows


def _check_tile_rows(rows: int) -> None:
    if not isinstance(rows, int) or rows < 0 or rows == 1:
        raise ValueError(f"{TILE_ROWS_ENV} must be 0 (off) or a row count >= 2, got {rows!r}")


#: a bad value is not raised at import (``zm --help`` must work whatever the environment holds):
#: ``_tile_rows`` is then -1, which every tiled branch and ``gemm_tile_rows`` turn into the
#: ValueError; a valid value costs the hot path nothing extra
_tile_rows_error = ""
try:
    _tile_rows = _tile_rows_from_env()
except ValueError as err:
    _tile_rows, _tile_rows_error = -1, str(err)


def _raise_bad_tile_rows() -> None:
    raise ValueError(_tile_rows_error)


def gemm_tile_rows() -> int:
    """Rows of every GEMM call in the portable mode; 0 when the mode is off (the default).
    ValueError naming the variable when ``ZEROMISMATCH_GEMM_TILE_ROWS`` holds a bad value."""
    if _tile_rows < 0:
        _raise_bad_tile_rows()
    return _tile_rows


def set_gemm_tile_rows(rows: int) -> None:
    """Turn the portable fixed-tile mode on (``rows`` >= 2, e.g. 16) or off (0) for this process
    (also replaces a bad value read from the environment). Packed weights stay valid (the mode
    changes the calls, not the packing)."""
    global _tile_rows
    _check_tile_rows(rows)
    _tile_rows = rows


def _cpu_has_amx_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:  # not Linux: no such CPU was measured
        return False


#: bf16 rows per GEMM call when ``ZEROMISMATCH_GEMM_TILE_ROWS`` is unset, on CPUs with AMX bf16
#: tiles: there oneDNN's bf16 kernels pick their blocking by M (measured on a Xeon with amx_bf16,
#: torch 2.13, 1 and 2 threads: rows 16..36 of a K = 1024 GEMM differ from the same rows in a
#: 67-row call, while K <= 512 agreed), so every bf16 call gets exactly 16 rows, which restored
#: every aligned invariance check there. fp32 runs AVX-512 kernels on those CPUs and keeps the
#: untiled path. 0 elsewhere.
AMX_BF16_TILE_ROWS = 16 if TILE_ROWS_ENV not in os.environ and _cpu_has_amx_bf16() else 0


def _tile_for(dtype: torch.dtype) -> int:
    """The rows of every GEMM call for ``dtype``: the portable mode's, else the AMX bf16 tiles."""
    if _tile_rows:
        return _tile_rows
    return AMX_BF16_TILE_ROWS if dtype is torch.bfloat16 else 0


def _in_tiles(call: Callable[[torch.Tensor], torch.Tensor], x2d: torch.Tensor, tile: int) -> torch.Tensor:
    """``call`` on consecutive ``tile``-row tiles of ``x2d`` (the last zero-padded), joined:
    every library call sees the same shape, whatever M is (see the module docstring)."""
    if tile < 0:
        _raise_bad_tile_rows()
    m, k = x2d.shape
    pad = -m % tile
    src = torch.cat((x2d, x2d.new_zeros(pad, k))) if pad else x2d.contiguous()
    if m + pad == tile:
        return call(src)[:m]
    return torch.cat([call(src[i : i + tile]) for i in range(0, m + pad, tile)])[:m]


def _onednn_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without mkldnn
        return False


_ONEDNN = _onednn_available()
_LINEAR = torch.ops.mkldnn._linear_pointwise.default if _ONEDNN else None


# ---- prepacked weights (held in kernels/weight_cache.py) --------------------------------------
def check_gemm_environment() -> None:
    """ValueError naming the variable when ``ZEROMISMATCH_GEMM_TILE_ROWS`` or ``..._PACKED_WEIGHTS_MB``
    holds a bad value: for callers about to run GEMMs (the engine, ``zm invariance``), so the error
    comes before any work, not from a GEMM inside an engine step (reported per request there)."""
    if _tile_rows < 0:
        _raise_bad_tile_rows()
    if _PACKED.budget_bytes < 0:
        raise ValueError(_PACKED.budget_error)


def _pack(plain: torch.Tensor, min_cols: int) -> tuple[torch.Tensor, int]:
    plain = plain.detach().contiguous()
    if plain.shape[0] < min_cols:
        plain = _pad_rows(plain, min_cols)
    packed = torch.ops.mkldnn._reorder_linear_weight(plain, None)
    return packed, int(torch.ops.mkldnn._nbytes(packed))


def _packable(*weights: torch.Tensor) -> bool:
    return _ONEDNN and all(w.is_cpu and w.dtype in ONEDNN_MIN_ROWS for w in weights)


def packed_weight(weight: torch.Tensor, min_cols: int = 1) -> torch.Tensor | None:
    """The oneDNN-packed form of ``weight`` [N, K] (padded with zero rows up to ``min_cols``
    output columns), cached while the weight is unchanged; None when it may not be cached."""
    if not _packable(weight):
        return None
    return _PACKED.lookup((weight,), ("linear", min_cols), lambda: _pack(weight, min_cols))


def packed_k_pieces(weight: torch.Tensor, pieces: int) -> list[torch.Tensor] | None:
    """Packed ``weight[:, piece j]`` for ``pieces`` equal K-slices (one cache entry for all)."""
    if not _packable(weight):
        return None
    k = weight.shape[1] // pieces

    def build():
        packed = [_pack(weight[:, j * k : (j + 1) * k], ONEDNN_MIN_COLS) for j in range(pieces)]
        return [p for p, _ in packed], sum(n for _, n in packed)

    return _PACKED.lookup((weight,), ("k-pieces", pieces), build)


def packed_experts(*stacked: torch.Tensor) -> list[torch.Tensor] | None:
    """Per expert e, packed ``cat([w[e] for w in stacked])`` of stacked weights ``[E, N_i, K]``
    (e.g. gate and up fused into one ``[2I, H]`` GEMM), one cache entry for all experts."""
    if not _packable(*stacked):
        return None

    def build():
        experts = range(stacked[0].shape[0])
        packed = [_pack(torch.cat([w[e] for w in stacked]), ONEDNN_MIN_COLS) for e in experts]
        return [p for p, _ in packed], sum(n for _, n in packed)

    return _PACKED.lookup(stacked, ("experts",), build)


def linear_prepacked(x2d: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The row-invariant GEMM with a weight from ``packed_weight`` / ``packed_k_pieces`` /
    ``packed_experts`` (same bits as ``row_invariant_linear`` on the plain weight). A single
    row is padded to ``ONEDNN_MIN_ROWS``; x2d must be contiguous. No autograd."""
    m = x2d.shape[0]
    tile = _tile_for(x2d.dtype)
    if tile and m:
        return _in_tiles(lambda rows: _LINEAR(rows, packed, None, "none", [None], ""), x2d, tile)
    if m >= ONEDNN_MIN_ROWS[x2d.dtype]:
        return _LINEAR(x2d, packed, None, "none", [None], "")
    x2d = torch.cat((x2d, x2d.new_zeros(ONEDNN_MIN_ROWS[x2d.dtype] - m, x2d.shape[1])))
    return _LINEAR(x2d, packed, None, "none", [None], "")[:m]


def onednn_linear(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x2d @ weight.T`` through oneDNN with the weight packed once (no padding, so no row
    invariance at M=1): the fast stock path the default set uses."""
    packed = packed_weight(weight)
    weight = weight.contiguous() if packed is None else packed
    return _LINEAR(x2d.contiguous(), weight, None, "none", [None], "")


# ---- the row-invariant GEMM ----------------------------------------------------------------
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


def _onednn_forward(x2d: torch.Tensor, weight: torch.Tensor, cache: bool = True) -> torch.Tensor:
    m, n = x2d.shape[0], weight.shape[0]
    packed = packed_weight(weight, ONEDNN_MIN_COLS) if cache else None
    if packed is None:
        weight = weight.contiguous()
        packed = _pad_rows(weight, ONEDNN_MIN_COLS) if n < ONEDNN_MIN_COLS else weight
    tile = _tile_for(x2d.dtype)
    if tile:
        return _in_tiles(lambda rows: _LINEAR(rows, packed, None, "none", [None], ""), x2d, tile)[:, :n]
    padded = m < ONEDNN_MIN_ROWS[x2d.dtype]
    if padded:  # zero rows (rows never interact in a GEMM; padding only selects the kernel)
        x2d = torch.cat((x2d, x2d.new_zeros(ONEDNN_MIN_ROWS[x2d.dtype] - m, x2d.shape[1])))
    elif not x2d.is_contiguous():
        x2d = x2d.contiguous()
    out = _LINEAR(x2d, packed, None, "none", [None], "")
    if n < ONEDNN_MIN_COLS:
        return out[:m, :n]
    return out[:m] if padded else out


class _OneDNNLinear(torch.autograd.Function):
    """oneDNN's op has no autograd formula (backprop through it silently gives no grads),
    so the backward is written out. Gradients need no row invariance: only the forward
    logprobs are compared between engine and trainer."""

    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x2d, weight)
        # a weight that is being trained is not cached (grad mode is off inside forward)
        return _onednn_forward(x2d, weight, cache=not weight.requires_grad)

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
    ``weight`` may be a view (an expert of a stacked weight, a K-slice): its packed form is
    cached per view. Differentiable (plain GEMM backward).
    """
    if x2d.dim() != 2 or weight.dim() != 2 or x2d.shape[1] != weight.shape[1] or x2d.dtype != weight.dtype:
        _check(x2d, weight)
    m = x2d.shape[0]
    if m == 0:
        return x2d.new_zeros(0, weight.shape[0]) + weight.sum() * 0
    if _ONEDNN and x2d.is_cpu and x2d.dtype in ONEDNN_MIN_ROWS:
        if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad):
            return _OneDNNLinear.apply(x2d, weight)
        return _onednn_forward(x2d, weight)
    return _mkl_fallback(x2d.contiguous(), weight.contiguous())


def uses_batched_pieces(piece_k: int, n: int, dtype: torch.dtype) -> bool:
    """Whether K-pieces ``[M, piece_k] x [piece_k, n]`` go through one batched GEMM (module docstring)."""
    if _tile_rows:  # the batched MKL GEMM was not measured on other machines: per-piece oneDNN tiles
        if _tile_rows < 0:
            _raise_bad_tile_rows()
        return False
    return dtype == torch.float32 and n >= BATCHED_MIN_COLS and piece_k * n <= BATCHED_PIECE_MAX_ELEMENTS


def batched_pieces(x2d: torch.Tensor, weight: torch.Tensor, pieces: int) -> torch.Tensor:
    """``stack([x2d[:, piece j] @ weight[:, piece j].T for j])`` ``[pieces, M, N]`` fp32 in one
    batched GEMM: x's pieces are copied into a fresh ``[pieces, max(M, 16), K/V]`` buffer (zero
    rows pad; rows never interact, padding only selects the kernel) and the weight is read as a
    strided ``[pieces, K/V, N]`` view. Differentiable."""
    m, k = x2d.shape[0], x2d.shape[1] // pieces
    x_pieces = x2d.reshape(m, pieces, k).transpose(0, 1)
    weight_pieces = weight.unflatten(1, (pieces, k)).permute(1, 2, 0)
    if m >= BATCHED_MIN_ROWS:
        return torch.bmm(x_pieces.contiguous(), weight_pieces)
    if torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad):
        padded = F.pad(x_pieces, (0, 0, 0, BATCHED_MIN_ROWS - m))
    else:
        padded = x2d.new_zeros(pieces, BATCHED_MIN_ROWS, k)
        padded[:, :m].copy_(x_pieces)
    return torch.bmm(padded, weight_pieces)[:, :m]


def row_invariant_pieces(x2d: torch.Tensor, weight: torch.Tensor, pieces: int) -> list[torch.Tensor]:
    """The partial products (in x's dtype) of ``pieces`` equal K-slices, in piece order, each with row
    invariance: small fp32 pieces from ``batched_pieces``, all others exactly
    ``[row_invariant_linear(x2d[:, piece j], weight[:, piece j]) for j]`` with the row padding,
    the slicing of x and the packed-weight lookup done once for all pieces."""
    if x2d.dim() != 2 or weight.dim() != 2 or x2d.shape[1] != weight.shape[1] or x2d.dtype != weight.dtype:
        _check(x2d, weight)
    if x2d.shape[1] % pieces != 0:
        raise ValueError(f"input dim {x2d.shape[1]} is not divisible into {pieces} pieces")
    k = x2d.shape[1] // pieces
    if x2d.shape[0] > 0 and uses_batched_pieces(k, weight.shape[0], x2d.dtype):
        return list(batched_pieces(x2d, weight, pieces).unbind(0))
    m, n = x2d.shape[0], weight.shape[0]
    packed = None
    if (
        m > 0
        and n >= ONEDNN_MIN_COLS
        and _packable(x2d)
        and not (torch.is_grad_enabled() and (x2d.requires_grad or weight.requires_grad))
    ):
        packed = packed_k_pieces(weight, pieces)
    if packed is None:
        return [
            row_invariant_linear(x2d[:, j * k : (j + 1) * k], weight[:, j * k : (j + 1) * k])
            for j in range(pieces)
        ]
    tile = _tile_for(x2d.dtype)
    if tile:
        x_pieces = x2d.view(m, pieces, k).transpose(0, 1)

        def piece_call(w_piece):
            return lambda rows: _LINEAR(rows, w_piece, None, "none", [None], "")

        return [_in_tiles(piece_call(w_piece), x_piece, tile) for x_piece, w_piece in zip(x_pieces, packed)]
    rows = max(m, ONEDNN_MIN_ROWS[x2d.dtype])
    # one copy lays the pieces out contiguously: [pieces, rows, k] (zero rows pad a single row)
    x_pieces = x2d.new_zeros(pieces, rows, k) if m < rows else x2d.new_empty(pieces, rows, k)
    x_pieces[:, :m].copy_(x2d.view(m, pieces, k).transpose(0, 1))
    outs = [_LINEAR(x_piece, w_piece, None, "none", [None], "") for x_piece, w_piece in zip(x_pieces, packed)]
    return [out[:m] for out in outs] if m < rows else outs


def _mkl_fallback(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # always a fresh (allocator-aligned) buffer whose row stride is a multiple of 16 elements:
    # MKL dgemm picks a different kernel for rows that start misaligned (odd K, odd row)
    m, k = x2d.shape
    if _tile_rows < 0:
        _raise_bad_tile_rows()
    unit = _tile_rows or FALLBACK_MIN_ROWS
    rows = -(-m // unit) * unit
    stride = -(-k // FALLBACK_MIN_ROWS) * FALLBACK_MIN_ROWS
    buf = x2d.new_zeros(rows, stride)
    buf[:m, :k] = x2d
    if _tile_rows:  # e.g. cuBLAS, which picks its kernel by M: every call gets the same shape
        return torch.cat([F.linear(buf[i : i + unit, :k], weight) for i in range(0, rows, unit)])[:m]
    return F.linear(buf[:, :k], weight)[:m]
