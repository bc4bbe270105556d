"""Default (stock, fastest torch) attention, MoE and Mamba2 ops -- no invariance promised.

- attention: prefill / chunked-prefill sequences go one at a time through
  ``F.scaled_dot_product_attention`` (``is_causal`` when q_len == kv_len, an explicit
  bottom-right mask otherwise); sequences with q_len == 1 (decode) take a separate batched
  path over their keys padded to the longest context: one ``scaled_dot_product_attention``
  call with a key-padding mask in fp32, a batched matmul-softmax in bf16 (each the faster of
  the two here for its dtype). Which path a query takes, and the padded length, depend on the
  batch.
- paged_attention: gather each sequence's K/V from its cache blocks, then the same.
- moe_route: ``torch.topk`` (no tie-break promise), ``torch.softmax`` / ``torch.sigmoid``
  as transformers' Qwen3-MoE / DeepSeek-V3 routers compute them.
- moe_experts: per expert, ``F.linear`` on exactly the tokens routed to it (the GEMM shape,
  hence the kernel, depends on how many tokens share the expert) and ``index_add_``.
- causal_conv1d: ``F.conv1d`` per sequence for prefill; a batched window-times-weight sum for
  an all-decode step (transformers' ``causal_conv1d_fn`` / ``causal_conv1d_update``).
- ssm_scan: the chunked SSD algorithm of transformers' ``mamba2_chunk_scan`` (chunk size
  ``SSD_CHUNK``) for prefill, the recurrent ``selective_state_update`` step when every
  sequence has exactly one token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..aligned.attention import gather_rows_reusing_buffer as _gather_rows
from ..aligned.moe import check_experts
from ..aligned.ssm import check_conv, check_scan, through_slots

#: chunk length of the SSD prefill algorithm (Nemotron-H's config default)
SSD_CHUNK = 128


# ---- attention ---------------------------------------------------------------------------
def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale):
    """Packed causal attention, stock path (see module docstring)."""
    cu_k = cu_seqlens_k.to(torch.int64)
    kv_lens = (cu_k[1:] - cu_k[:-1]).tolist()

    def slots(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return cu_k[seqs][:, None] + pos[None, :]

    starts = cu_k.tolist()

    def seq_kv(s: int):  # contiguous: zero-copy slices
        return k[starts[s] : starts[s + 1]], v[starts[s] : starts[s + 1]]

    return _attend(q, k, v, cu_seqlens_q.tolist(), kv_lens, slots, seq_kv, scale)


def paged_attention(q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale):
    """Paged causal attention, stock path: gather each sequence's slots, then attend."""
    block_size = k_cache.shape[1]
    table = block_table.to(torch.int64)

    def slots(seqs: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        blk = (pos // block_size).clamp(max=table.shape[1] - 1)
        return table[seqs][:, blk] * block_size + (pos % block_size)[None, :]

    k_flat = k_cache.reshape(-1, *k_cache.shape[2:])
    v_flat = v_cache.reshape(-1, *v_cache.shape[2:])

    def seq_kv(s: int):
        idx = slots(torch.tensor([s]), torch.arange(lens[s], device=q.device))[0]
        return k_flat[idx], v_flat[idx]

    lens = kv_lens.tolist()
    return _attend(q, k_flat, v_flat, cu_seqlens_q.tolist(), lens, slots, seq_kv, scale)


def _attend(q, k_src, v_src, cu_q, kv_lens, slots, seq_kv, scale):
    num_seqs = len(cu_q) - 1
    hq, hkv = q.shape[1], k_src.shape[1]
    out = q.new_empty(q.shape[0], hq, v_src.shape[2])
    decode = [s for s in range(num_seqs) if cu_q[s + 1] - cu_q[s] == 1]
    for s in range(num_seqs):
        q_len, kv_len = cu_q[s + 1] - cu_q[s], kv_lens[s]
        if q_len <= 1:
            continue
        kk, vv = seq_kv(s)
        qs = q[cu_q[s] : cu_q[s + 1]].transpose(0, 1)  # [Hq, q_len, D]
        if q_len == kv_len:
            mask, causal = None, True
        else:
            q_pos = kv_len - q_len + torch.arange(q_len, device=q.device)
            mask, causal = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None], False
        o = F.scaled_dot_product_attention(
            qs,
            kk.transpose(0, 1),
            vv.transpose(0, 1),
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=hq != hkv,
        )
        out[cu_q[s] : cu_q[s + 1]] = o.transpose(0, 1)
    if decode:
        _decode(q, k_src, v_src, cu_q, kv_lens, slots, scale, decode, out)
    return out


def _decode(q, k_src, v_src, cu_q, kv_lens, slots, scale, seqs, out) -> None:
    """One query per sequence: one gather of all contexts padded to the longest, then, in fp32,
    one ``scaled_dot_product_attention`` call with a key-padding mask (measured 1.6-2.4x faster
    here than a matmul-softmax over the same gather) and, in bf16, a batched matmul-softmax
    (measured 1.2-3.4x faster than SDPA in bf16 on this CPU)."""
    hq, hkv, dqk = q.shape[1], k_src.shape[1], q.shape[2]
    seq_t = torch.tensor(seqs, device=q.device)
    lens = torch.tensor([kv_lens[s] for s in seqs], device=q.device)
    longest = int(lens.max())
    pos = torch.arange(longest, device=q.device)
    beyond = pos[None, :] >= lens[:, None]  # [B, L]
    idx = slots(seq_t, pos).masked_fill(beyond, 0)
    flat = idx.flatten()  # one contiguous-row gather each (index_select beats k_src[idx] here)
    reuse = not (torch.is_grad_enabled() and (q.requires_grad or k_src.requires_grad or v_src.requires_grad))
    # reused gather buffers, as the aligned set has: fresh multi-MB buffers pay a page fault per page
    keys = _gather_rows(k_src.reshape(k_src.shape[0], -1), flat, "default_keys", reuse)
    vals = _gather_rows(v_src.reshape(v_src.shape[0], -1), flat, "default_values", reuse)
    # stale cache contents past kv_len must not reach P@V (0 * nan = nan); a row fill of the
    # padded slots measured faster than a broadcast masked_fill over [B, L, Hkv, Dv]
    padded_slots = beyond.flatten().nonzero().squeeze(1)
    if padded_slots.numel():
        vals = vals.index_fill_(0, padded_slots, 0.0)
    keys = keys.view(*idx.shape, hkv, dqk)
    vals = vals.view(*idx.shape, hkv, -1).transpose(1, 2)  # [B, Hkv, L, Dv]
    rows = torch.tensor([cu_q[s] for s in seqs], device=q.device)
    if q.dtype in (torch.float32, torch.float64):
        o = F.scaled_dot_product_attention(
            q[rows].unsqueeze(2),  # [B, Hq, 1, D]
            keys.transpose(1, 2),
            vals,
            attn_mask=~beyond[:, None, None, :],
            scale=scale,
            enable_gqa=hq != hkv,
        )
    else:
        qd = q[rows].view(len(seqs), hkv, hq // hkv, dqk)  # [B, Hkv, G, D]
        scores = torch.matmul(qd, keys.permute(0, 2, 3, 1)).float() * scale  # [B, Hkv, G, L]
        scores = scores.masked_fill_(beyond[:, None, None, :], float("-inf"))
        o = torch.matmul(torch.softmax(scores, dim=-1).to(vals.dtype), vals)
    out[rows] = o.reshape(len(seqs), hq, -1).to(out.dtype)


# ---- MoE ---------------------------------------------------------------------------------
def moe_route(
    router_logits,
    top_k,
    scoring="softmax",
    norm_topk_prob=True,
    correction_bias=None,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
):
    """transformers' routers (Qwen3MoeTopKRouter / DeepSeekV3TopkRouter math)."""
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    logits = router_logits.float()
    if scoring == "softmax":
        probs = torch.softmax(logits, dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * routed_scaling_factor, ids
    scores = logits.sigmoid()
    choice = scores + correction_bias.float() if correction_bias is not None else scores
    num_experts = logits.shape[1]
    if n_group > 1:
        group_scores = choice.view(-1, n_group, num_experts // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = (
            group_mask.unsqueeze(-1).expand(-1, n_group, num_experts // n_group).reshape(-1, num_experts)
        )
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


def moe_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation="silu"):
    """transformers' expert loop: F.linear on each expert's token batch, index_add_ into the output."""
    check_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)
    out = torch.zeros_like(x)
    for expert in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.where(topk_ids == expert)
        rows = x[token_idx]
        if activation == "silu":
            hidden = F.silu(F.linear(rows, w_gate[expert])) * F.linear(rows, w_up[expert])
        else:
            hidden = torch.relu(F.linear(rows, w_up[expert])).square()
        y = F.linear(hidden, w_down[expert]) * topk_weights[token_idx, slot, None]
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


# ---- Mamba2 ------------------------------------------------------------------------------
def causal_conv1d(
    x, weight, bias, cu_seqlens, conv_state=None, activation="silu", state_slots=None, has_initial_state=None
):
    """Depthwise causal conv, stock path (see module docstring)."""
    cu_t, width = check_conv(
        x, weight, bias, cu_seqlens, conv_state, activation, state_slots, has_initial_state
    )
    return through_slots(
        conv_state,
        state_slots,
        has_initial_state,
        lambda state: _causal_conv1d(x, weight, bias, cu_t, state, activation),
    )


def _causal_conv1d(x, weight, bias, cu_t, conv_state, activation):
    width = weight.shape[1]
    cu = cu_t.tolist()
    num_seqs, channels = len(cu) - 1, x.shape[1]
    state = conv_state.to(x.dtype) if conv_state is not None else x.new_zeros(num_seqs, channels, width - 1)
    if all(cu[s + 1] - cu[s] == 1 for s in range(num_seqs)):
        window = torch.cat([state, x[:, :, None]], dim=-1)  # [S, C, W]
        y = (window * weight).sum(-1)
        if bias is not None:
            y = y + bias
        y = F.silu(y) if activation == "silu" else y
        return y.to(x.dtype), window[:, :, 1:].contiguous()
    ys, states = [], []
    for s in range(num_seqs):
        seq = torch.cat([state[s], x[cu[s] : cu[s + 1]].T], dim=-1)  # [C, W-1+L]
        y = F.conv1d(seq[None], weight[:, None, :], bias, groups=channels)[0].T  # [L, C]
        ys.append(F.silu(y) if activation == "silu" else y)
        states.append(seq[:, seq.shape[1] - (width - 1) :])
    return torch.cat(ys).to(x.dtype), torch.stack(states)


def ssm_scan(
    x,
    dt,
    A,
    B,
    C,
    D,
    dt_bias,
    cu_seqlens,
    ssm_state=None,
    dt_limit=(0.0, float("inf")),
    state_slots=None,
    has_initial_state=None,
):
    """Mamba2 scan, stock path: recurrent step for an all-decode batch, chunked SSD otherwise."""
    cu_t = check_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, state_slots, has_initial_state)
    return through_slots(
        ssm_state,
        state_slots,
        has_initial_state,
        lambda state: _ssm_scan(x, dt, A, B, C, D, dt_bias, cu_t.tolist(), state, dt_limit),
    )


def _ssm_scan(x, dt, A, B, C, D, dt_bias, cu, ssm_state, dt_limit):
    num_seqs, (_, heads, head_dim), state_size = len(cu) - 1, x.shape, B.shape[2]
    init = (
        ssm_state.float()
        if ssm_state is not None
        else x.new_zeros(num_seqs, heads, head_dim, state_size, dtype=torch.float32)
    )
    rep = heads // B.shape[1]
    if all(cu[s + 1] - cu[s] == 1 for s in range(num_seqs)):
        dts = torch.clamp(F.softplus(dt.float() + dt_bias.float()), dt_limit[0], dt_limit[1])
        dA = torch.exp(dts * A.float())[:, :, None, None]
        Bh = B.float().repeat_interleave(rep, dim=1)
        Ch = C.float().repeat_interleave(rep, dim=1)
        state = init * dA + (dts[:, :, None] * Bh)[:, :, None, :] * x.float()[..., None]
        y = torch.matmul(state, Ch[..., None])[..., 0] + D.float()[:, None] * x.float()
        return y.to(x.dtype), state
    ys, finals = [], []
    for s in range(num_seqs):
        sl = slice(cu[s], cu[s + 1])
        y, final = _ssd(x[sl], dt[sl], A, B[sl], C[sl], D, dt_bias, init[s], dt_limit, rep)
        ys.append(y)
        finals.append(final)
    return torch.cat(ys).to(x.dtype), torch.stack(finals)


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    n = a.size(-1)
    a = a[..., None].expand(*a.size(), n)
    a = a.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=a.device), -1), 0)
    seg = torch.cumsum(a, dim=-2)
    return seg.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=a.device), 0), -torch.inf)


def _ssd(x, dt, A, B, C, D, dt_bias, init, dt_limit, rep):
    """transformers' mamba2_chunk_scan for one sequence (batch 1), returning (y [L,Hs,P], final state)."""
    length = x.shape[0]
    dt = torch.clamp(F.softplus(dt.float() + dt_bias.float()), dt_limit[0], dt_limit[1])  # [L, Hs]
    xf = x.float()
    Bh, Ch = B.float().repeat_interleave(rep, dim=1), C.float().repeat_interleave(rep, dim=1)
    pad = (SSD_CHUNK - length % SSD_CHUNK) % SSD_CHUNK
    d_res = D.float()[:, None] * xf
    xs = F.pad(xf * dt[..., None], (0, 0, 0, 0, 0, pad)).view(-1, SSD_CHUNK, *xf.shape[1:])  # c l h p
    a = F.pad(A.float() * dt, (0, 0, 0, pad)).view(-1, SSD_CHUNK, dt.shape[1]).permute(2, 0, 1)  # h c l
    Bc = F.pad(Bh, (0, 0, 0, 0, 0, pad)).view(-1, SSD_CHUNK, *Bh.shape[1:])  # c l h n
    Cc = F.pad(Ch, (0, 0, 0, 0, 0, pad)).view(-1, SSD_CHUNK, *Ch.shape[1:])
    a_cum = torch.cumsum(a, dim=-1)
    L = torch.exp(_segment_sum(a))  # h c l s
    y_diag = torch.einsum("clhn,cshn,hcls,cshp->clhp", Cc, Bc, L, xs)
    decay_states = torch.exp(a_cum[:, :, -1:] - a_cum)  # h c l
    states = torch.einsum("clhn,hcl,clhp->chpn", Bc, decay_states, xs)
    states = torch.cat([init[None], states], dim=0)
    decay_chunk = torch.exp(_segment_sum(F.pad(a_cum[:, :, -1], (1, 0))))  # h z c
    new_states = torch.einsum("hzc,chpn->zhpn", decay_chunk, states)
    states, final = new_states[:-1], new_states[-1]
    y_off = torch.einsum("clhn,chpn,hcl->clhp", Cc, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(-1, *xf.shape[1:])[:length] + d_res
    return y, final
