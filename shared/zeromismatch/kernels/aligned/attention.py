"""Aligned causal attention: split-KV with a fixed key block, one combine order per query.

Algorithm (the same for the trainer's packed K/V and the engine's paged cache):

1. Each sequence's keys/values for absolute positions ``0 .. kv_len-1`` are gathered into
   key blocks of exactly ``KEY_BLOCK`` positions (the last block padded; padded values are
   zeroed). Where the keys came from (a packed tensor, or cache blocks of any size in any
   order) is invisible after this step.
2. Query rows are the (query, q-head-in-group) pairs of one KV head (GQA folds the group into
   rows), in fp32. Every GEMM has at least ``MIN_ROWS`` (16) rows (a sequence's last query is
   repeated to fill them), a fixed reduction length (Dqk for scores, ``KEY_BLOCK`` for P@V)
   and a fixed column count (``KEY_BLOCK`` for scores, max(Dv + 1, 16) for P@V: value head
   dims below 15 get zero columns, because batched fp32 MKL took other kernels at some row
   counts with fewer than 16 columns; tests/kernels/test_kernel_edge_inputs.py). Measured on this
   CPU (torch 2.13 + MKL): batched fp32 matmul with >= 16 rows gives each row the same bits
   whatever the row count, batch count, neighbours or the operands' row stride (each head's
   keys and values are read as a strided slice of the token-major gather);
   tests/kernels/test_attention.py checks the consequence end to end.
3. Per query at absolute position p and per block b <= p // KEY_BLOCK: scores (keys after p
   set to -inf), block max m_b, probs = exp(s - m_b) (exact zeros at masked keys), and
   ``probs @ [V_b | 1 | 0...]``: the block output o_b and, in the ones column, the block sum
   l_b, both from one GEMM with the fixed reduction length ``KEY_BLOCK``.
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

Implementation notes (none of them changes which numbers meet in which op):
- Keys and values are gathered with one row gather each (a row = one token's or cache slot's
  ``Hkv * D`` values) into the token-major ``[B, L, Hkv, D]`` layout, into buffers reused
  across calls when no input needs autograd (fresh multi-MB buffers paid a page fault per
  page). Each KV head's GEMMs read that buffer through a strided view (no heads-first copy) and
  write into one shared output buffer, so the row-local ops run once for all heads.
- Everything that depends only on the batch layout (row and key indices, causal masks) is a
  per-step *plan*, built once and reused by every layer while the batch tensors are the same
  objects at the same version (see ``_cached_plan``).
- The GEMMs always run on all ``MIN_ROWS``-padded rows; the row-local ops between them run
  only on the rows that carry a real query, and P @ V gets zero rows as padding (rows never
  interact in a GEMM; only the shape selects the kernel). Equal-length sequences are batched.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .gemm import gemm_tile_rows

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
#: most query rows of equal-length sequences batched into one group
_GROUP_ROWS = 2048
#: fewest output columns of the P @ V GEMM: batched fp32 MKL matmul took another kernel at some
#: row counts when N < 16 (gemm.py's docstring; measured here for Dv + 1 = 9), so small value
#: head dims get zero columns after their ones column. Dv >= 15 keeps its Dv + 1 columns.
PV_MIN_COLS = 16
#: matrices per batched GEMM call in the portable mode off the CPU (every call the same shape)
_BATCH_TILE = 16
_NEG_INF = float("-inf")


def _check_offsets(cu: torch.Tensor, total: int, name: str) -> list[int]:
    if cu.dim() != 1 or cu.numel() < 1 or cu.is_floating_point():
        raise ValueError(f"{name} must be a 1-D integer offsets tensor [S+1]")
    offsets = cu.tolist()
    if offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name} must be non-decreasing from 0 to {total}, got {offsets}")
    return offsets


def _check_common(q: torch.Tensor, hkv: int, dqk: int, scale: float) -> None:
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


def check_packed_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, scale) -> None:
    """The shape checks of :func:`attention` (shared with the aligned-native set)."""
    if k.dim() != 3 or v.dim() != 3 or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k [Tk, Hkv, Dqk] and v [Tk, Hkv, Dv] disagree: {tuple(k.shape)}, {tuple(v.shape)}")
    _check_common(q, k.shape[1], k.shape[2], scale)
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError("cu_seqlens_k must have the same length as cu_seqlens_q")


def check_paged_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale) -> None:
    """The shape checks of :func:`paged_attention` (shared with the aligned-native set)."""
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(
            f"k_cache [blocks, block_size, Hkv, Dqk] and v_cache [blocks, block_size, Hkv, Dv] disagree: "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    _check_common(q, k_cache.shape[2], k_cache.shape[3], scale)
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1 or cu_seqlens_q.is_floating_point():
        raise ValueError("cu_seqlens_q must be a 1-D integer offsets tensor [S+1]")
    num_seqs = cu_seqlens_q.numel() - 1
    if block_table.dim() != 2 or block_table.shape[0] != num_seqs:
        raise ValueError(f"block_table must be [S={num_seqs}, max_blocks], got {tuple(block_table.shape)}")
    if kv_lens.shape != (num_seqs,):
        raise ValueError(f"kv_lens must be [S={num_seqs}], got {tuple(kv_lens.shape)}")


# ---- per-step plan ------------------------------------------------------------------------------
# Everything below that depends only on the batch layout (which query rows, which key rows, the
# causal masks) is computed once and reused by every layer of a forward: the model calls attention
# once per layer with the *same* offsets / block-table / kv_lens tensor objects. The single-entry
# cache is keyed on the identity and in-place version of those tensors plus the head layout, and
# holds references to them, so a freed tensor's id can never be mistaken for a live one. The plan
# holds index tensors only; it decides which numbers meet in which op, never how they are combined.


@dataclass
class _TilePlan:
    lo: int
    hi: int
    start: int
    n_blocks: int
    #: leading tile rows that carry a real query; the rest only pad the GEMMs to MIN_ROWS rows
    real: int
    blocked: torch.Tensor  # [B, NB, real, KEY_BLOCK] bool: key after the query (score -> -inf)
    active: torch.Tensor  # [B, NB, real] bool: block starts at or before the query


@dataclass
class _GroupPlan:
    nseq: int
    slots: int
    kept_slots: int  # query slots per sequence in the result (the padding-only slots are dropped)
    q_index: torch.Tensor  # [B * slots] token of each query slot (last query repeated)
    n_blocks: int
    kv_rows: torch.Tensor  # [B * L] rows of src.reshape(-1, Hkv * D) (a token's or slot's heads)
    invalid_rows: torch.Tensor | None  # rows of that layout past kv_len (values zeroed)
    tiles: list[_TilePlan]
    pick: torch.Tensor | None  # real query slots among the B * slots (None: all are real)
    out_tokens: torch.Tensor  # output row of each picked slot


_plan_cache: tuple | None = None  # (key, tensors, versions, plan) of the last call

# Reused gather buffers. Every decode step gathers a few MB of keys/values per layer; fresh
# allocations of that size come from mmap and pay a page fault per 4 KiB page on first write,
# which measured slower than the gather itself. Only used when no input needs autograd (a
# reused buffer would overwrite tensors saved for backward) and below ``_WORKSPACE_MAX`` elements.
# Per thread, so that concurrent callers never share a buffer.
_thread_state = threading.local()
_WORKSPACE_MAX = 1 << 24


def _scratch(name: str, shape: tuple[int, ...], dtype, device, reuse: bool) -> torch.Tensor:
    numel = 1
    for n in shape:
        numel *= n
    if not reuse or numel > _WORKSPACE_MAX:
        return torch.empty(shape, dtype=dtype, device=device)
    workspace = getattr(_thread_state, "workspace", None)
    if workspace is None:
        workspace = _thread_state.workspace = {}
    # a buffer made under inference mode is an inference tensor, which may not be written in place
    # outside it: each mode keeps its own buffers
    name = (name, torch.is_inference_mode_enabled())
    buf = workspace.get(name)
    if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != torch.device(device):
        buf = torch.empty(numel, dtype=dtype, device=device)
        workspace[name] = buf
    return buf[:numel].view(shape)


def _cached_plan(key: tuple, tensors: tuple[torch.Tensor, ...], build):
    """The plan for ``key`` built from ``tensors`` unchanged since the last call, else ``build()``."""
    global _plan_cache
    if any(t.is_inference() for t in tensors):  # no version counter: an in-place edit would go unseen
        return build()
    # a plan built under inference mode holds inference tensors, which autograd may not save
    key = (threading.get_ident(), torch.is_inference_mode_enabled(), *key)
    versions = tuple(t._version for t in tensors)
    hit = _plan_cache
    if (
        hit is not None
        and hit[0] == key
        and hit[2] == versions
        and len(hit[1]) == len(tensors)
        and all(a is b for a, b in zip(hit[1], tensors))
    ):
        return hit[3]
    plan = build()
    _plan_cache = (key, tensors, versions, plan)
    return plan


def _build_plan(cu_list, kv_list, key_index, hkv: int, group: int, device) -> list[_GroupPlan]:
    """Group sequences (grouping never changes bits: every GEMM is row-invariant) and plan each group."""
    lens = [b - a for a, b in zip(cu_list, cu_list[1:])]
    if any(n > kv for n, kv in zip(lens, kv_list)):
        raise ValueError("every sequence needs kv_len >= q_len (this step's keys must be included)")
    if lens and group <= _BATCHED_ROWS and all(n == 1 for n in lens):
        return [_plan_decode(cu_list, kv_list, key_index, group, device)]
    small = [s for s, n in enumerate(lens) if 0 < n * group <= _BATCHED_ROWS]
    groups = [small] if small else []
    # sequences of one tile or less with the same q_len (e.g. equal-length prompts) share a group:
    # no slot padding, and at most _GROUP_ROWS query rows per group to bound the memory
    same_len: dict[int, list[int]] = {}
    for s, n in enumerate(lens):
        if n * group > _ROW_TILE:
            groups.append([s])
        elif n * group > _BATCHED_ROWS:
            members = same_len.setdefault(n, [])
            if members and (len(members) + 1) * n * group > _GROUP_ROWS:
                groups.append(members)
                members = same_len[n] = []
            members.append(s)
    groups += list(same_len.values())
    return [_plan_group(cu_list, lens, kv_list, key_index, seqs, hkv, group, device) for seqs in groups]


def _plan_decode(cu_list, kv_list, key_index, group, device) -> _GroupPlan:
    """The plan ``_plan_group`` builds for an all-decode batch (one query per sequence, every
    sequence in one group), with fewer ops: a decode step builds a new plan every step."""
    nseq = len(kv_list)
    slots = -(-MIN_ROWS // group)
    starts = torch.tensor(cu_list[:-1], dtype=torch.int64, device=device)
    kv_len = torch.tensor(kv_list, dtype=torch.int64, device=device)
    n_blocks = -(-max(kv_list) // KEY_BLOCK)
    pos = torch.arange(n_blocks * KEY_BLOCK, device=device)
    k_valid = pos[None, :] < kv_len[:, None]
    kv_rows = torch.where(k_valid, key_index(torch.arange(nseq, device=device), pos), 0).flatten()
    invalid = (~k_valid).flatten().nonzero().squeeze(1)
    query_pos = (kv_len - 1)[:, None].expand(nseq, group)  # the real rows: one query, G heads
    key_pos = pos.view(n_blocks, KEY_BLOCK)
    blocked = key_pos[None, :, None, :] > query_pos[:, None, :, None]
    active = key_pos[:, 0][None, :, None] <= query_pos[:, None, :]
    tile = _TilePlan(0, slots * group, 0, n_blocks, group, blocked, active)
    return _GroupPlan(
        nseq,
        slots,
        1,
        starts.repeat_interleave(slots),
        n_blocks,
        kv_rows,
        invalid if invalid.numel() else None,
        [tile],
        None,
        starts,
    )


def _plan_group(cu_list, lens, kv_list, key_index, seqs, hkv, group, device) -> _GroupPlan:
    seq_lens, seq_kv = [lens[s] for s in seqs], [kv_list[s] for s in seqs]
    nseq = len(seqs)
    # query slots per sequence; extra slots repeat the sequence's last query so that every GEMM
    # has >= MIN_ROWS rows (repeated rows are computed and dropped; rows never interact)
    slots = max(max(seq_lens), -(-MIN_ROWS // group))
    rows = slots * group
    g_qlen = torch.tensor(seq_lens, dtype=torch.int64, device=device)
    g_kvlen = torch.tensor(seq_kv, dtype=torch.int64, device=device)
    g_start = torch.tensor([cu_list[s] for s in seqs], dtype=torch.int64, device=device)
    slot_query = torch.minimum(torch.arange(slots, device=device)[None, :], g_qlen[:, None] - 1)
    q_tok = g_start[:, None] + slot_query  # [B, slots]
    # row = slot * group + head_in_group, ascending in position
    q_pos = ((g_kvlen - g_qlen)[:, None] + slot_query).repeat_interleave(group, dim=1)
    seqs_t = torch.tensor(seqs, dtype=torch.int64, device=device)

    # keys/values of positions 0 .. n_blocks*KEY_BLOCK-1; values are zeroed past kv_len
    n_blocks = -(-max(seq_kv) // KEY_BLOCK)
    pos = torch.arange(n_blocks * KEY_BLOCK, device=device)
    k_valid = pos[None, :] < g_kvlen[:, None]  # [B, L]
    kv_rows = torch.where(k_valid, key_index(seqs_t, pos), 0).flatten()
    invalid = (~k_valid).flatten().nonzero().squeeze(1)

    tiles = []
    # row tiles (rows are ascending in position, so a tile only needs the blocks up to its last row)
    for lo in range(0, rows, _ROW_TILE):
        hi = min(rows, lo + _ROW_TILE)
        start = max(0, min(lo, hi - MIN_ROWS))  # a short last tile re-computes earlier rows: >= MIN_ROWS
        tile_pos = q_pos[:, start:hi]
        tile_blocks = int(tile_pos.max()) // KEY_BLOCK + 1
        # one tile of a group of short sequences (decode): only the first max_q slots hold distinct
        # queries; the rows after them exist for the GEMMs alone, so the row-local ops skip them
        real = max(seq_lens) * group if rows <= _ROW_TILE else hi - start
        key_pos = torch.arange(tile_blocks * KEY_BLOCK, device=device).view(tile_blocks, KEY_BLOCK)
        real_pos = tile_pos[:, :real]
        blocked = key_pos[None, :, None, :] > real_pos[:, None, :, None]  # [B, NB, real, KB]
        active = key_pos[:, 0][None, :, None] <= real_pos[:, None, :]  # [B, NB, real]
        tiles.append(_TilePlan(lo, hi, start, tile_blocks, real, blocked, active))

    kept_slots = tiles[0].real // group if len(tiles) == 1 else slots
    pick = None
    out_tokens = q_tok[:, :kept_slots].flatten()
    if sum(seq_lens) < nseq * kept_slots:
        is_query = torch.arange(kept_slots, device=device)[None, :] < g_qlen[:, None]
        pick = is_query.flatten().nonzero().squeeze(1)
        out_tokens = out_tokens[pick]
    return _GroupPlan(
        nseq,
        slots,
        kept_slots,
        q_tok.flatten(),
        n_blocks,
        kv_rows,
        invalid if invalid.numel() else None,
        tiles,
        pick,
        out_tokens,
    )


# ---- entry points ---------------------------------------------------------------------------------
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen attention over packed K/V (bottom-right aligned); see module docstring."""
    check_packed_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, scale)
    hkv, group = k.shape[1], q.shape[1] // k.shape[1]

    def build():
        cu_q = _check_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
        cu_k = _check_offsets(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
        starts = cu_seqlens_k[:-1].to(torch.int64)

        def key_index(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            return starts[seqs][:, None] + pos[None, :]

        kv_lens = [b - a for a, b in zip(cu_k, cu_k[1:])]
        return _build_plan(cu_q, kv_lens, key_index, hkv, group, q.device)

    key = ("packed", q.shape[0], k.shape[0], hkv, group, q.device)
    plan = _cached_plan(key, (cu_seqlens_q, cu_seqlens_k), build)
    return _attend(q, k, v, plan, scale)


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
    check_paged_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale)
    hkv = k_cache.shape[2]
    cache_block = k_cache.shape[1]
    group = q.shape[1] // hkv

    def build():
        cu_q = _check_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
        kv_list = kv_lens.tolist()
        if any(n > block_table.shape[1] * cache_block for n in kv_list):
            raise ValueError("kv_lens exceed the blocks in block_table")
        table = block_table.to(torch.int64)
        max_blocks = table.shape[1]

        def key_index(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            blk = (pos // cache_block).clamp(max=max_blocks - 1)
            return table[seqs][:, blk] * cache_block + (pos % cache_block)[None, :]

        return _build_plan(cu_q, kv_list, key_index, hkv, group, q.device)

    key = ("paged", q.shape[0], cache_block, hkv, group, q.device)
    plan = _cached_plan(key, (block_table, cu_seqlens_q, kv_lens), build)
    return _attend(q, k_cache, v_cache, plan, scale)


def _attend(q, k_src, v_src, plan: list[_GroupPlan], scale: float) -> torch.Tensor:
    """k_src / v_src: ``[..., Hkv, D]`` with contiguous token-major rows (packed K/V or the cache)."""
    tq, hq, _ = q.shape
    hkv, dv = k_src.shape[-2], v_src.shape[-1]
    out = torch.empty(tq, hq, dv, dtype=q.dtype, device=q.device)
    k_rows = k_src.reshape(-1, hkv * k_src.shape[-1])  # one row per token / cache slot, all heads
    v_rows = v_src.reshape(-1, hkv * dv)
    reuse = not (torch.is_grad_enabled() and (q.requires_grad or k_src.requires_grad or v_src.requires_grad))
    for group_plan in plan:
        _attend_group(q, k_rows, v_rows, hkv, group_plan, scale, out, reuse)
    return out


def _attend_group(q, k_rows, v_rows, hkv, plan: _GroupPlan, scale, out, reuse: bool) -> None:
    """Attend one group of sequences; queries are laid out [Hkv, B, ...] (B = plan.nseq), keys and
    values stay token-major ``[B, blocks, KEY_BLOCK, Hkv, D]`` (one row gather per token, no
    heads-first copy: each head's GEMM reads its strided slice)."""
    dqk, dv, group = k_rows.shape[1] // hkv, v_rows.shape[1] // hkv, q.shape[1] // hkv
    nseq, slots = plan.nseq, plan.slots
    rows = slots * group
    # [B * slots, Hkv, G * D] -> [Hkv, B, rows, D] in fp32 (a row gather, then one permuting copy)
    q_rows = torch.index_select(q.reshape(q.shape[0], hkv, group * dqk), 0, plan.q_index)
    q_rows = q_rows.transpose(0, 1)
    if q_rows.dtype == torch.float32:
        q_rows = q_rows.contiguous()
    else:
        q_rows = q_rows.to(torch.float32, memory_format=torch.contiguous_format)
    q_rows = q_rows.view(hkv, nseq, rows, dqk)

    keys = gather_rows_reusing_buffer(k_rows, plan.kv_rows, "keys", reuse).to(torch.float32)
    keys = keys.view(nseq, plan.n_blocks, KEY_BLOCK, hkv, dqk)
    # values get a ones column per head: P @ [V | 1] yields each block's probability sum from the
    # same GEMM; values past kv_len are zeroed (stale cache slots may hold nan: 0 * nan = nan)
    n_pos = plan.kv_rows.numel()
    width = pv_columns(dv)
    vals = _scratch("values", (n_pos, hkv, width), torch.float32, q.device, reuse)
    gathered = gather_rows_reusing_buffer(v_rows, plan.kv_rows, "gathered_values", reuse)
    vals[:, :, :dv].copy_(gathered.view(n_pos, hkv, dv))
    if plan.invalid_rows is not None:  # (measured faster than a masked copy or a where)
        vals.index_fill_(0, plan.invalid_rows, 0.0)
    vals[:, :, dv] = 1.0
    if width > dv + 1:
        vals[:, :, dv + 1 :] = 0.0
    vals = vals.view(nseq, plan.n_blocks, KEY_BLOCK, hkv, width)

    if len(plan.tiles) == 1:
        tile = plan.tiles[0]
        result = _attend_rows(
            q_rows, tile, keys[:, : tile.n_blocks], vals[:, : tile.n_blocks], dv, scale, reuse
        )
    else:
        result = q_rows.new_empty(hkv, nseq, rows, dv)  # vals carry pv_columns(dv) columns; results dv
        for tile in plan.tiles:
            tile_out = _attend_rows(
                q_rows[:, :, tile.start : tile.hi],
                tile,
                keys[:, : tile.n_blocks],
                vals[:, : tile.n_blocks],
                dv,
                scale,
                reuse,
            )
            result[:, :, tile.lo : tile.hi] = tile_out[:, :, tile.lo - tile.start :]
    result = result.view(hkv, nseq * plan.kept_slots, group, dv)
    if plan.pick is not None:
        result = result.index_select(1, plan.pick)
    picked = result.permute(1, 0, 2, 3).reshape(-1, hkv * group, dv).to(out.dtype)
    out.index_copy_(0, plan.out_tokens, picked)


def pv_columns(dv: int) -> int:
    """Columns of the P @ V GEMM for value head dim ``dv``: values, the ones column, zero padding."""
    return max(dv + 1, PV_MIN_COLS)


def gather_rows_reusing_buffer(src: torch.Tensor, index: torch.Tensor, name: str, reuse: bool):
    """``src[index]`` (rows), into a per-thread buffer reused across calls when allowed (``out=``
    has no autograd; the result is overwritten by the next call with the same ``name``). A speed
    device only: the default set's decode uses it too, so neither side pays fresh page faults."""
    if not reuse:
        return torch.index_select(src, 0, index)
    buf = _scratch(name, (index.numel(), src.shape[1]), src.dtype, src.device, True)
    return torch.index_select(src, 0, index, out=buf)


def _fixed_batch_matmul(a: torch.Tensor, b: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """``a @ b`` over the flattened ``batch_shape``, in calls of exactly ``_BATCH_TILE`` matrices (the
    last call zero-padded): the portable mode off the CPU, where cuBLAS picks its fp32 batched kernel
    by the batch count (measured on an H200; see gemm.py's portable mode)."""
    a = a.expand(*batch_shape, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*batch_shape, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    count = a.shape[0]
    pad = -count % _BATCH_TILE
    if pad:
        a = torch.cat((a, a.new_zeros(pad, *a.shape[1:])))
        b = torch.cat((b, b.new_zeros(pad, *b.shape[1:])))
    parts = [
        torch.matmul(a[i : i + _BATCH_TILE], b[i : i + _BATCH_TILE])
        for i in range(0, count + pad, _BATCH_TILE)
    ]
    return torch.cat(parts)[:count].view(*batch_shape, a.shape[1], b.shape[2])


def _per_head_matmul(name: str, a, b, shape, reuse: bool) -> torch.Tensor:
    """``stack([a[h] @ b(h) for h])``: one batched GEMM per KV head (b(h) is a strided view of the
    token-major keys/values), written into one buffer when no autograd is needed."""
    if gemm_tile_rows() and a.device.type != "cpu":
        return torch.stack([_fixed_batch_matmul(a[h], b(h), shape[1:-2]) for h in range(shape[0])])
    if not reuse:
        return torch.stack([torch.matmul(a[h], b(h)) for h in range(shape[0])])
    result = _scratch(name, shape, torch.float32, a.device, True)
    for h in range(shape[0]):
        torch.matmul(a[h], b(h), out=result[h])
    return result


def _attend_rows(q_rows, tile: _TilePlan, keys, vals, dv: int, scale: float, reuse: bool) -> torch.Tensor:
    """Split-KV attention of query rows over key blocks; every op is row-local (see module docstring).

    q_rows ``[Hkv, B, R, Dqk]`` fp32 (R >= MIN_ROWS), keys ``[B, NB, KEY_BLOCK, Hkv, Dqk]``,
    vals ``[B, NB, KEY_BLOCK, Hkv, pv_columns(Dv)]`` (zero past kv_len; column Dv all ones, zeros
    after it), masks from
    ``tile``. Returns ``[Hkv, B, tile.real, Dv]``: the leading ``tile.real`` rows. The GEMMs always
    run on all R rows (that fixes the kernel); the row-local ops in between only on the real rows,
    and P @ V gets zero rows as padding (rows never interact in a GEMM, only the shape counts).
    """
    hkv, nseq, rows, _ = q_rows.shape
    n_blocks, width, real = keys.shape[1], vals.shape[-1], tile.real
    # one GEMM per (head, sequence, block), each R x KEY_BLOCK with reduction Dqk
    scores = _per_head_matmul(
        "scores",
        q_rows[:, :, None],
        lambda h: keys[:, :, :, h].transpose(-1, -2),
        (hkv, nseq, n_blocks, rows, KEY_BLOCK),
        reuse,
    )
    scores = scores[..., :real, :] * scale
    scores = scores.masked_fill_(tile.blocked, _NEG_INF)
    block_max = scores.amax(-1)  # [Hkv, B, NB, real]; -inf for a block entirely after the query
    # skipped blocks: shift by 0 instead of -inf so exp gives exact zeros, never -inf - -inf = nan
    probs = torch.exp(scores - torch.where(tile.active, block_max, 0.0)[..., None])
    if real < rows:
        shape = (*probs.shape[:-2], rows, KEY_BLOCK)
        padded = _scratch("padded_probs", shape, probs.dtype, probs.device, reuse)
        padded[..., real:, :].zero_()
        padded[..., :real, :] = probs
        probs = padded
    # [Hkv, B, NB, R, pv_columns(Dv)], reduction length KEY_BLOCK; column Dv is the block's sum of probs
    block_acc = _per_head_matmul(
        "block_acc", probs, lambda h: vals[:, :, :, h], (hkv, nseq, n_blocks, rows, width), reuse
    )[..., :real, :]
    row_max = block_max.amax(2, keepdim=True)  # exact: max does not round
    block_acc = block_acc * torch.where(tile.active, torch.exp(block_max - row_max), 0.0)[..., None]
    # ascending block order; skipped blocks add exact zeros, so the tile's block count changes nothing
    acc = block_acc[:, :, 0]
    for b in range(1, n_blocks):
        acc = acc + block_acc[:, :, b]
    return acc[..., :dv] / acc[..., dv : dv + 1]
