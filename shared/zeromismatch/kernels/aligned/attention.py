"""Aligned causal attention: split-KV with a fixed key block, one combine order per query.

Algorithm (the same for the trainer's packed K/V and the engine's paged cache):

1. Each sequence's keys/values for absolute positions ``0 .. kv_len-1`` are gathered into
   key blocks of exactly ``KEY_BLOCK`` positions (the last block padded; padded values are
   zeroed). Where the keys came from (a packed tensor, or cache blocks of any size in any
   order) is invisible after this step.
2. Query rows are the (query, q-head-in-group) pairs of one KV head (GQA folds the group into
   rows), in fp32. Every GEMM has at least ``MIN_ROWS`` (16) rows (a sequence's last query is
   repeated to fill them), a fixed reduction length (Dqk for scores, ``KEY_BLOCK`` for P@V)
   and a fixed column count (``KEY_BLOCK`` for scores, Dv + 1 for P@V). Measured on this CPU
   (torch 2.13 + MKL): batched fp32 matmul with >= 16 rows gives each row the same bits
   whatever the row count, batch count or neighbours (see ``MIN_ROWS``);
   tests/kernels/test_attention.py checks the consequence end to end.
3. Per query at absolute position p and per block b <= p // KEY_BLOCK: scores (keys after p
   set to -inf), block max m_b, probs = exp(s - m_b) (exact zeros at masked keys), and
   ``probs @ [V_b | 1]``: the block output o_b and, in the extra column, the block sum l_b,
   both from one GEMM with the fixed reduction length ``KEY_BLOCK``.
   Blocks entirely after p are *skipped*: they are shifted by 0 instead of their -inf max (no
   -inf - -inf = nan) and weighted by an exact 0.
4. Combine (flash-decoding style): M = max_b m_b (exact), w_b = exp(m_b - M), then
   ``l = sum_b w_b l_b`` and ``o = sum_b w_b o_b`` added in ascending block order, one block at
   a time; out = o / l. Skipped blocks add exact zeros, so how many padded blocks a call
   carries (it depends on the longest query in the tile) never changes a bit.

Every step is row-local with fixed shapes per row, so a query's output is a function of (q,
its keys/values, p) only: identical bits in a full prefill, a chunked prefill of any chunk
size, a decode step over a paged cache of any block size and block order, and in any batch.
Elementwise transcendental ops used here (exp) were measured to give the same bits wherever
an element sits in a tensor (unlike torch.sigmoid/silu/softplus on this CPU).
Outputs are returned in q's dtype; all arithmetic is fp32.
"""

from __future__ import annotations

import torch

#: key positions per block; every query's softmax is combined over blocks of this size
KEY_BLOCK = 64
#: minimum rows of every batched attention GEMM. Measured (torch 2.13 + MKL, fp32 batched
#: matmul): rows 1-3 always take other kernels; 8 passed isolated sweeps but failed the
#: end-to-end invariance test with 2 threads; 16 passes everything.
MIN_ROWS = 16
#: sequences with at most this many query rows (q_len * group) are batched into one call
_BATCHED_ROWS = 16
#: query rows attended together (bounds memory; rows are independent, so no numeric effect)
_ROW_TILE = 256
_NEG_INF = float("-inf")


def _check_offsets(cu: torch.Tensor, total: int, name: str) -> list[int]:
    if cu.dim() != 1 or cu.numel() < 1 or cu.is_floating_point():
        raise ValueError(f"{name} must be a 1-D integer offsets tensor [S+1]")
    offsets = cu.tolist()
    if offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name} must be non-decreasing from 0 to {total}, got {offsets}")
    return offsets


def _check_common(q: torch.Tensor, hkv: int, dqk: int, cu_seqlens_q: torch.Tensor, scale: float) -> list[int]:
    if q.dim() != 3:
        raise ValueError(f"q must be [Tq, Hq, Dqk], got shape {tuple(q.shape)}")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating tensor, got {q.dtype}")
    if q.shape[2] != dqk:
        raise ValueError(f"q head dim {q.shape[2]} != key head dim {dqk}")
    if hkv <= 0 or q.shape[1] % hkv != 0:
        raise ValueError(f"q heads {q.shape[1]} must be a multiple of kv heads {hkv}")
    if not isinstance(scale, (float, int)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    return _check_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen attention over packed K/V (bottom-right aligned); see module docstring."""
    if k.dim() != 3 or v.dim() != 3 or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k [Tk, Hkv, Dqk] and v [Tk, Hkv, Dv] disagree: {tuple(k.shape)}, {tuple(v.shape)}")
    cu_q = _check_common(q, k.shape[1], k.shape[2], cu_seqlens_q, scale)
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError("cu_seqlens_k must have the same length as cu_seqlens_q")
    cu_k = _check_offsets(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    starts = cu_seqlens_k[:-1].to(torch.int64)

    def key_index(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return starts[seqs][:, None] + pos[None, :]

    kv_lens = [b - a for a, b in zip(cu_k, cu_k[1:])]
    return _attend(q, k, v, cu_q, kv_lens, key_index, scale)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention over a paged KV cache; bitwise equal to :func:`attention`."""
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(
            f"k_cache [blocks, block_size, Hkv, Dqk] and v_cache [blocks, block_size, Hkv, Dv] disagree: "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    cu_q = _check_common(q, k_cache.shape[2], k_cache.shape[3], cu_seqlens_q, scale)
    num_seqs = len(cu_q) - 1
    if block_table.dim() != 2 or block_table.shape[0] != num_seqs:
        raise ValueError(f"block_table must be [S={num_seqs}, max_blocks], got {tuple(block_table.shape)}")
    if kv_lens.shape != (num_seqs,):
        raise ValueError(f"kv_lens must be [S={num_seqs}], got {tuple(kv_lens.shape)}")
    cache_block = k_cache.shape[1]
    kv_list = kv_lens.tolist()
    if any(n > block_table.shape[1] * cache_block for n in kv_list):
        raise ValueError("kv_lens exceed the blocks in block_table")
    table = block_table.to(torch.int64)
    flat_k = k_cache.reshape(-1, k_cache.shape[2], k_cache.shape[3])
    flat_v = v_cache.reshape(-1, v_cache.shape[2], v_cache.shape[3])
    max_blocks = table.shape[1]

    def key_index(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        blk = (pos // cache_block).clamp(max=max_blocks - 1)
        return table[seqs][:, blk] * cache_block + (pos % cache_block)[None, :]

    return _attend(q, flat_k, flat_v, cu_q, kv_list, key_index, scale)


def _attend(q, k_src, v_src, cu_list, kv_list, key_index, scale: float) -> torch.Tensor:
    """Group sequences (grouping never changes bits: every GEMM is row-invariant) and attend."""
    tq, hq, _ = q.shape
    hkv, dv = k_src.shape[1], v_src.shape[2]
    group = hq // hkv
    lens = [b - a for a, b in zip(cu_list, cu_list[1:])]
    if any(n > kv for n, kv in zip(lens, kv_list)):
        raise ValueError("every sequence needs kv_len >= q_len (this step's keys must be included)")
    out = torch.empty(tq, hq, dv, dtype=q.dtype, device=q.device)
    small = [s for s, n in enumerate(lens) if 0 < n * group <= _BATCHED_ROWS]
    groups = [small] if small else []
    groups += [[s] for s, n in enumerate(lens) if n * group > _BATCHED_ROWS]
    for seqs in groups:
        seq_lens, seq_kv = [lens[s] for s in seqs], [kv_list[s] for s in seqs]
        _attend_group(q, k_src, v_src, cu_list, key_index, seqs, seq_lens, seq_kv, group, scale, out)
    return out


def _attend_group(q, k_src, v_src, cu_list, key_index, seqs, seq_lens, seq_kv, group, scale, out) -> None:
    """Attend the sequences ``seqs`` together; tensors are laid out [Hkv, B, ...] (B = len(seqs))."""
    hkv, dqk, dv = k_src.shape[1], k_src.shape[2], v_src.shape[2]
    nseq = len(seqs)
    max_q = max(seq_lens)
    # query slots per sequence; extra slots repeat the sequence's last query so that every GEMM
    # has >= MIN_ROWS rows (repeated rows are computed and dropped; rows never interact)
    slots = max(max_q, -(-MIN_ROWS // group))
    rows = slots * group
    starts = [cu_list[s] for s in seqs]
    tok_list, pos_list = [], []
    for start, q_len, kv_len in zip(starts, seq_lens, seq_kv):
        last = q_len - 1
        tok_list.append([start + min(i, last) for i in range(slots)])
        pos_list.append([kv_len - q_len + min(i, last) for i in range(slots)])
    q_tok = torch.tensor(tok_list, dtype=torch.int64, device=q.device)  # [B, slots]
    # row = slot * group + head_in_group, ascending in position
    q_pos = torch.tensor(pos_list, dtype=torch.int64, device=q.device).repeat_interleave(group, dim=1)
    q_rows = q.view(q.shape[0], hkv, group, dqk).transpose(0, 1)[:, q_tok].float()  # [Hkv, B, slots, G, D]
    q_rows = q_rows.view(hkv, nseq, rows, dqk)
    seqs = torch.tensor(seqs, dtype=torch.int64, device=q.device)
    g_kvlen = torch.tensor(seq_kv, dtype=torch.int64, device=q.device)

    # keys/values of positions 0 .. n_blocks*KEY_BLOCK-1; values zeroed past kv_len (stale cache may be nan)
    n_blocks = -(-max(seq_kv) // KEY_BLOCK)
    pos = torch.arange(n_blocks * KEY_BLOCK, device=q.device)
    k_valid = pos[None, :] < g_kvlen[:, None]  # [B, L]
    idx = torch.where(k_valid, key_index(seqs, pos), 0)
    keys = _gather_heads_first(k_src, idx).view(hkv, nseq, n_blocks, KEY_BLOCK, dqk)
    # values get a ones column: P @ [V | 1] yields each block's probability sum from the same GEMM
    vals = _gather_heads_first(v_src, idx, extra_ones_column=True)
    vals[..., :dv].masked_fill_(~k_valid[None, :, :, None], 0.0)
    vals = vals.view(hkv, nseq, n_blocks, KEY_BLOCK, dv + 1)

    result = q_rows.new_empty(hkv, nseq, rows, dv)  # vals carry dv + 1 columns; results dv
    # row tiles (rows are ascending in position, so a tile only needs the blocks up to its last row)
    for lo in range(0, rows, _ROW_TILE):
        hi = min(rows, lo + _ROW_TILE)
        start = max(0, min(lo, hi - MIN_ROWS))  # a short last tile re-computes earlier rows: >= MIN_ROWS
        tile_pos = q_pos[:, start:hi]
        tile_blocks = int(tile_pos.max()) // KEY_BLOCK + 1
        tile_out = _attend_rows(
            q_rows[:, :, start:hi], tile_pos, keys[:, :, :tile_blocks], vals[:, :, :tile_blocks], scale
        )
        result[:, :, lo:hi] = tile_out[:, :, lo - start :]
    result = result.view(hkv, nseq, slots, group, dv).permute(1, 2, 0, 3, 4).reshape(nseq * slots, -1, dv)
    picks = [b * slots + i for b, q_len in enumerate(seq_lens) for i in range(q_len)]
    if len(picks) < nseq * slots:
        pick_t = torch.tensor(picks, dtype=torch.int64, device=q.device)
        out[q_tok.flatten()[pick_t]] = result[pick_t].to(out.dtype)
    else:
        out[q_tok.flatten()] = result.to(out.dtype)


def _gather_heads_first(
    src: torch.Tensor, idx: torch.Tensor, extra_ones_column: bool = False
) -> torch.Tensor:
    """``src[idx]`` laid out ``[H, *idx.shape, D (+1)]`` in fp32: one row gather, one permuting copy."""
    rows = torch.index_select(src.reshape(src.shape[0], -1), 0, idx.flatten())
    rows = rows.view(*idx.shape, src.shape[1], src.shape[2])
    perm = (rows.dim() - 2, *range(rows.dim() - 2), rows.dim() - 1)
    if not extra_ones_column:
        return rows.permute(perm).to(torch.float32, memory_format=torch.contiguous_format)
    out = torch.empty(src.shape[1], *idx.shape, src.shape[2] + 1, dtype=torch.float32, device=src.device)
    out[..., :-1].copy_(rows.permute(perm))
    out[..., -1] = 1.0
    return out


def _attend_rows(q_rows, q_pos, keys, vals, scale: float) -> torch.Tensor:
    """Split-KV attention of query rows over key blocks; every op is row-local (see module docstring).

    q_rows ``[Hkv, B, R, Dqk]`` fp32 (R >= MIN_ROWS), q_pos ``[B, R]`` absolute positions,
    keys ``[Hkv, B, NB, KEY_BLOCK, Dqk]``, vals ``[Hkv, B, NB, KEY_BLOCK, Dv + 1]`` (zero past kv_len;
    last column all ones). Returns ``[Hkv, B, R, Dv]``.
    """
    n_blocks = keys.shape[2]
    # one GEMM per (head, sequence, block), each R x KEY_BLOCK with reduction Dqk
    scores = torch.matmul(q_rows[:, :, None], keys.transpose(-1, -2)) * scale  # [Hkv, B, NB, R, KB]
    key_pos = torch.arange(n_blocks * KEY_BLOCK, device=q_rows.device).view(n_blocks, KEY_BLOCK)
    allowed = key_pos[None, :, None, :] <= q_pos[:, None, :, None]  # [B, NB, R, KB]
    scores = torch.where(allowed, scores, _NEG_INF)
    block_max = scores.amax(-1)  # [Hkv, B, NB, R]; -inf for a block entirely after the query
    active = key_pos[:, 0][None, :, None] <= q_pos[:, None, :]  # [B, NB, R]
    # skipped blocks: shift by 0 instead of -inf so exp gives exact zeros, never -inf - -inf = nan
    probs = torch.exp(scores - torch.where(active, block_max, 0.0)[..., None])
    # [Hkv, B, NB, R, Dv + 1], reduction length KEY_BLOCK; the last column is the block's sum of probs
    block_acc = torch.matmul(probs, vals)
    row_max = block_max.amax(2, keepdim=True)  # exact: max does not round
    block_acc = block_acc * torch.where(active, torch.exp(block_max - row_max), 0.0)[..., None]
    # ascending block order; skipped blocks add exact zeros, so the tile's block count changes nothing
    acc = block_acc[:, :, 0]
    for b in range(1, n_blocks):
        acc = acc + block_acc[:, :, b]
    return acc[..., :-1] / acc[..., -1:]
