"""The written-out gradient of packed causal varlen attention (the trainer's backward).

The forward the trainer compares with the engine is the native kernel's (``attention.py``); its
gradient needs no bitwise parity, only the function's. Recomputing the pure-torch aligned
attention and differentiating it (``_autograd.py``) cost about 70% of a trainer step on
tiny-qwen3 (benchmarks/trainer_step.py): the aligned op runs per sequence, per KV head, padded
to 16 query rows. This is the standard softmax-attention backward instead, per sequence in fp32
over all heads at once (one [H, Lq, Lk] score block, so memory grows with the longest sequence,
not the batch):

    P = softmax(scale * Q K^T + causal mask)
    dV = P^T dO      dP = dO V^T      dS = P * (dP - rowsum(P * dP))
    dQ = scale * dS K      dK = scale * dS^T Q

with K/V heads shared by ``H / Hkv`` query heads (their gradients summed over the group) and the
mask bottom-right aligned (query j of Lq sees keys 0 .. Lk - Lq + j), as the forward's.
"""

from __future__ import annotations

import torch


def packed_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` in the inputs' dtypes for q ``[Tq, H, D]``, k ``[Tk, Hkv, D]``,
    v ``[Tk, Hkv, Dv]``, grad_out ``[Tq, H, Dv]`` and the sequences' offsets."""
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for (q0, q1), (k0, k1) in zip(zip(cu_q, cu_q[1:]), zip(cu_k, cu_k[1:]), strict=True):
        lq, lk = q1 - q0, k1 - k0
        if lq == 0 or lk == 0:
            continue
        qs = q[q0:q1].float().transpose(0, 1)  # [H, Lq, D]
        ks = k[k0:k1].float().transpose(0, 1).repeat_interleave(group, 0)  # [H, Lk, D]
        vs = v[k0:k1].float().transpose(0, 1).repeat_interleave(group, 0)  # [H, Lk, Dv]
        go = grad_out[q0:q1].float().transpose(0, 1)  # [H, Lq, Dv]
        visible = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        scores = torch.matmul(qs, ks.transpose(1, 2)).mul_(scale).masked_fill_(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # a query that sees no key: no gradient
        d_probs = torch.matmul(go, vs.transpose(1, 2))
        d_scores = probs * (d_probs - (probs * d_probs).sum(-1, keepdim=True))
        dq[q0:q1] = torch.matmul(d_scores, ks).mul_(scale).transpose(0, 1)
        dk_h = torch.matmul(d_scores.transpose(1, 2), qs).mul_(scale)  # [H, Lk, D]
        dv_h = torch.matmul(probs.transpose(1, 2), go)  # [H, Lk, Dv]
        dk[k0:k1] = dk_h.view(kv_heads, group, lk, -1).sum(1).transpose(0, 1)
        dv[k0:k1] = dv_h.view(kv_heads, group, lk, -1).sum(1).transpose(0, 1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
