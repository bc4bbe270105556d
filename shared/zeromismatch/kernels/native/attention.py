"""Native fixed-order attention: the aligned set's invariance without its padded GEMMs.

The pure-torch aligned attention (``kernels/aligned/attention.py``) gets row invariance from
MKL's batched GEMM only when every call has >= 16 query rows; a decode step has one query per
sequence (Hq/Hkv rows per KV head), so it computes about 8x the useful work and re-gathers the
whole context every step. That is the floor the CPU speed targets of issues 3 and 5 hit.

This module computes attention in a small C kernel (``attention.c``) whose every output value
is one fixed sequence of IEEE operations wherever its query sits: each score is a dot product
in 16 strided lanes (ascending head dim within a lane) joined by a fixed tree, the softmax is
max / a fixed-polynomial exp / ascending-key sum, and P @ V accumulates in ascending key order
(the C file states the rule exactly). So a query gives
the same bits in a full prefill, a chunked prefill, a decode step over a paged cache of any
block size and order, and in any batch, by construction rather than by a measured library
property -- and, with no fused multiply-add and no reassociation, the same bits for any
compiler target (tests compare an ``-O0`` SSE2 build with the ``-O3 -march=native`` one). The
kernel reads keys and values in place through a per-sequence row index (no gather copy); for a
paged cache it computes that index from the block table itself, once per sequence and KV head,
checking the block id of every position below the sequence's kv_len.

Its bits differ from the pure-torch aligned attention's (a different, equally fixed order), so
engine and trainer must both use this set. Arithmetic is fp32; K/V may be fp32 or bf16 (read
in place), other dtypes are converted to fp32 first; outputs come back in q's dtype. The
backward (trainer) of packed attention is the written-out softmax-attention gradient
(``attention_backward.py``); the paged form's is the pure-torch aligned op's, recomputed.
Gradients need no bitwise parity, only the forward logprobs do.
"""

from __future__ import annotations

import torch

from ..aligned import attention as aligned_attention
from ..aligned.attention import _cached_plan, _check_offsets, check_packed_inputs, check_paged_inputs
from ..capture.allowed_host_reads import host_reads_for_checks
from . import _build
from ._autograd import native_with_reference_backward, refuse_double_backward
from ._device import CPU, require_cpu
from .attention_backward import packed_attention_backward

_IN_PLACE_KV = (torch.float32, torch.bfloat16)


class _Plan:
    """Per-step index tensors the kernel reads (shared by every layer of one forward): either
    ``key_index [S, W]`` (the row of position j of sequence s; packed K/V) or ``block_table [S, B]``
    with the cache's block size and block count (a paged cache: the kernel computes the rows and
    checks the block ids, once per sequence and KV head)."""

    def __init__(self, q_start, q_len, kv_len, key_index=None, block_table=None, block_size=0, num_blocks=0):
        index = key_index if key_index is not None else block_table
        self.index = index.contiguous()
        self.paged = key_index is None
        self.block_size, self.num_blocks = block_size, num_blocks
        self.q_start, self.q_len, self.kv_len = q_start, q_len, kv_len


def _check_keys_cover_queries(cu_q: list[int], kv_list: list[int]) -> list[int]:
    """Each sequence's query count (from the offsets), checked against its key count."""
    lens = [b - a for a, b in zip(cu_q, cu_q[1:])]
    if any(n > kv for n, kv in zip(lens, kv_list)):
        raise ValueError("every sequence needs kv_len >= q_len (this step's keys must be included)")
    return lens


def _plan_from(cu_q: list[int], kv_list: list[int], **index) -> _Plan:
    lens = _check_keys_cover_queries(cu_q, kv_list)

    def i64(values):
        return torch.tensor(values, dtype=torch.int64)

    return _Plan(i64(cu_q[:-1]), i64(lens), i64(kv_list), **index)


def _run(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, hkv: int, plan: _Plan, scale: float):
    """``[Tq, Hq, Dv]`` in q's dtype; k_rows / v_rows ``[N, Hkv*D]`` rows of all heads (CPU tensors:
    the callers check every tensor the kernel reads)."""
    tq, hq, dqk = q.shape
    dv = v_rows.shape[1] // hkv
    # the kernel reads fp32 or bf16 in place (raw pointers: contiguous, and a lazily negated view
    # resolved, since it shares its storage un-negated); other dtypes become fp32 (exact from fp16)
    k_rows, v_rows, q = (t.resolve_neg().resolve_conj() for t in (k_rows, v_rows, q))
    k_rows = (k_rows if k_rows.dtype in _IN_PLACE_KV else k_rows.float()).contiguous()
    v_rows = (v_rows if v_rows.dtype in _IN_PLACE_KV else v_rows.float()).contiguous()
    # each token's [Hq, Dqk] rows must be contiguous; the tokens may be apart (q sliced from a fused
    # q/k tensor is read in place rather than copied)
    q32 = q.detach().to(torch.float32)
    if tq and not q32[0].is_contiguous():
        q32 = q32.contiguous()
    out = torch.empty(tq, hq, dv, dtype=torch.float32, device=CPU)
    if tq == 0:
        return out.to(q.dtype)
    status = _build.library().zm_attention(
        q32.data_ptr(),
        q32.stride(0) if tq > 1 else hq * dqk,
        k_rows.data_ptr(),
        v_rows.data_ptr(),
        int(k_rows.dtype == torch.bfloat16),
        int(v_rows.dtype == torch.bfloat16),
        None if plan.paged else plan.index.data_ptr(),
        plan.index.shape[1],
        plan.index.data_ptr() if plan.paged else None,
        plan.block_size,
        plan.num_blocks,
        plan.q_start.data_ptr(),
        plan.q_len.data_ptr(),
        plan.kv_len.data_ptr(),
        plan.kv_len.numel(),
        hq,
        hkv,
        dqk,
        dv,
        float(scale),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status == -2:
        raise ValueError(f"block_table holds block ids outside 0..{plan.num_blocks - 1}")
    if status != 0:
        raise MemoryError("aligned-native attention could not allocate its scratch memory")
    return out if q.dtype == torch.float32 else out.to(q.dtype)


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
    require_cpu(q, k, v, cu_seqlens_q, cu_seqlens_k)
    hkv = k.shape[1]

    def build():
        cu_q = _check_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
        cu_k = _check_offsets(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
        kv_list = [b - a for a, b in zip(cu_k, cu_k[1:])]
        width = max(kv_list, default=0)
        starts = torch.tensor(cu_k[:-1], dtype=torch.int64)
        return _plan_from(cu_q, kv_list, key_index=starts[:, None] + torch.arange(width)[None, :])

    plan = _cached_plan(("native-packed", q.shape[0], k.shape[0], hkv), (cu_seqlens_q, cu_seqlens_k), build)

    def forward():
        # explicit widths: a reshape with -1 fails on zero tokens
        k_rows, v_rows = k.reshape(k.shape[0], hkv * k.shape[2]), v.reshape(v.shape[0], hkv * v.shape[2])
        return _run(q, k_rows, v_rows, hkv, plan, scale)

    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return forward()
    return _PackedAttention.apply(forward, q, k, v, cu_seqlens_q, cu_seqlens_k, scale)


class _PackedAttention(torch.autograd.Function):
    """The native forward with the written-out softmax-attention gradient
    (``attention_backward.py``): the trainer's backward without recomputing a reference forward."""

    @staticmethod
    def forward(ctx, forward_fn, q, k, v, cu_seqlens_q, cu_seqlens_k, scale):
        ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k)
        ctx.scale = scale
        return forward_fn()

    @staticmethod
    def backward(ctx, grad_out):
        refuse_double_backward()
        q, k, v, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = packed_attention_backward(grad_out, q, k, v, cu_q.tolist(), cu_k.tolist(), ctx.scale)
        need = ctx.needs_input_grad
        return (
            None,
            dq if need[1] else None,
            dk if need[2] else None,
            dv if need[3] else None,
            None,
            None,
            None,
        )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention over a paged KV cache, read in place; bitwise equal to :func:`attention`."""
    check_paged_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale)
    # the block table too: the kernel reads it from memory
    require_cpu(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens)
    hkv, cache_block = k_cache.shape[2], k_cache.shape[1]

    def build():
        # the lists only check; the plan's tensors are computed from the batch's tensors, so a step
        # graph (kernels/step_graph.py) replays this plan on the next step's offsets and lengths
        with host_reads_for_checks():
            cu_q = _check_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
            kv_list = kv_lens.tolist()
        if any(n < 0 for n in kv_list):
            raise ValueError(f"kv_lens must be >= 0, got {kv_list}")
        if any(n > block_table.shape[1] * cache_block for n in kv_list):
            raise ValueError("kv_lens exceed the blocks in block_table")
        _check_keys_cover_queries(cu_q, kv_list)
        cu = cu_seqlens_q.to(torch.int64)
        # the kernel checks the block id of every position below kv_len against the cache (status -2)
        return _Plan(
            cu[:-1].contiguous(),
            cu[1:] - cu[:-1],
            kv_lens.to(torch.int64).contiguous(),
            block_table=block_table.to(torch.int64),
            block_size=cache_block,
            num_blocks=k_cache.shape[0],
        )

    plan = _cached_plan(
        ("native-paged", q.shape[0], cache_block, hkv, k_cache.shape[0]),
        (block_table, cu_seqlens_q, kv_lens),
        build,
    )

    def forward():
        k_rows = k_cache.reshape(-1, hkv * k_cache.shape[3])
        return _run(q, k_rows, v_cache.reshape(-1, hkv * v_cache.shape[3]), hkv, plan, scale)

    def reference(q_, k_, v_):
        return aligned_attention.paged_attention(q_, k_, v_, block_table, cu_seqlens_q, kv_lens, scale)

    return native_with_reference_backward(forward, reference, q, k_cache, v_cache)
