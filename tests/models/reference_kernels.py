"""A test-only KernelSet in plain stock torch: simple, slow, obviously correct.

It exists so the model tests do not depend on the real kernel sets' internals: every op is
written the way the Hugging Face reference writes it (per-sequence loops, fp32 softmax,
recurrent Mamba2 scan), so ``ReferenceKernels`` vs ``transformers`` isolates the *model*
code. It makes no invariance promise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zeromismatch.kernels.base import KernelSet, QuantizedWeight

_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _stable_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries per row; ties go to the lower index."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


def dequantize_reference(qweight: QuantizedWeight) -> torch.Tensor:
    out_features, in_features = qweight.shape
    if qweight.format == "fp8":
        data = qweight.data.float()
        scales = qweight.scales.float()
        if qweight.block is None:
            return data * scales
        bo, bi = qweight.block
        expanded = scales.repeat_interleave(bo, 0)[:out_features].repeat_interleave(bi, 1)[:, :in_features]
        return data * expanded
    if qweight.format == "nvfp4":
        codes = torch.stack((qweight.data & 0x0F, qweight.data >> 4), dim=-1).reshape(
            out_features, in_features
        )
        magnitude = _E2M1_VALUES[(codes & 0x7).long()]
        values = torch.where((codes & 0x8) != 0, -magnitude, magnitude)
        block_scales = qweight.scales.float().repeat_interleave(16, 1)[:, :in_features]
        return values * block_scales * qweight.global_scale.float()
    raise ValueError(f"unknown quantized format {qweight.format!r}")


class ReferenceKernels(KernelSet):
    name = "reference"

    def linear(self, x, weight, bias=None):
        return F.linear(x, weight, bias)

    def row_parallel_linear(self, x_local, weight_local, bias=None, group=None, virtual_shards=4):
        partial = F.linear(x_local, weight_local)
        if group is not None:
            torch.distributed.all_reduce(partial, group=group)
        return partial if bias is None else partial + bias

    def rms_norm(self, x, weight, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def gated_rms_norm(self, x, gate, weight, eps, group_size):
        h = x.float() * F.silu(gate.float())
        grouped = h.view(*h.shape[:-1], h.shape[-1] // group_size, group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
        return weight * grouped.view(h.shape).to(x.dtype)

    def rope(self, x, positions, inv_freq, interleaved=False):
        freqs = positions[:, None].float() * inv_freq[None, :].float()
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        if interleaved:
            even, odd = x[..., 0::2].float(), x[..., 1::2].float()
            out = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
            return out.to(x.dtype)
        cos2 = torch.cat((cos, cos), -1).to(x.dtype)
        sin2 = torch.cat((sin, sin), -1).to(x.dtype)
        return x * cos2 + _rotate_half(x) * sin2

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def relu2(self, x):
        return torch.square(F.relu(x))

    def _attend(self, q, k, v, scale):
        q_len, hq, _ = q.shape
        kv_len, hkv, _ = k.shape
        rep = hq // hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        query_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
        mask = torch.arange(kv_len)[None, :] > query_pos
        scores = scores.masked_fill(mask[None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.einsum("hqk,khd->qhd", probs, v)

    def attention(self, q, k, v, cu_seqlens_q, cu_seqlens_k, scale):
        outs = []
        for s in range(cu_seqlens_q.numel() - 1):
            q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
            k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
            outs.append(self._attend(q[q0:q1], k[k0:k1], v[k0:k1], scale))
        return torch.cat(outs)

    def paged_attention(self, q, k_cache, v_cache, block_table, cu_seqlens_q, kv_lens, scale):
        block_size = k_cache.shape[1]
        flat_k = k_cache.reshape(-1, *k_cache.shape[2:])
        flat_v = v_cache.reshape(-1, *v_cache.shape[2:])
        outs = []
        for s in range(cu_seqlens_q.numel() - 1):
            q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
            pos = torch.arange(int(kv_lens[s]))
            slots = block_table[s, pos // block_size].long() * block_size + pos % block_size
            outs.append(self._attend(q[q0:q1], flat_k[slots], flat_v[slots], scale))
        return torch.cat(outs)

    def lm_head(self, hidden, weight):
        return F.linear(hidden.float(), weight.float())

    def log_softmax(self, logits):
        return torch.log_softmax(logits.float(), dim=-1)

    def processed_log_softmax(self, logits, temperature, top_k, top_p):
        raise NotImplementedError("not needed by the model tests")

    def moe_route(
        self,
        router_logits,
        top_k,
        scoring="softmax",
        norm_topk_prob=True,
        correction_bias=None,
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
    ):
        logits = router_logits.float()
        if scoring == "softmax":
            scores = torch.softmax(logits, dim=-1)
            choice = scores
        else:
            scores = torch.sigmoid(logits)
            choice = scores if correction_bias is None else scores + correction_bias.float()
            if n_group > 1:
                tokens, experts = choice.shape
                grouped = choice.view(tokens, n_group, experts // n_group)
                group_scores = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(-1)
                keep = _stable_topk(group_scores, topk_group)
                group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
                expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(tokens, experts)
                choice = choice.masked_fill(~expert_mask, float("-inf"))
        ids = _stable_topk(choice, top_k)
        weights = scores.gather(1, ids)
        if norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid" else 0.0))
        return weights * routed_scaling_factor, ids

    def moe_experts(self, x, topk_weights, topk_ids, w_gate, w_up, w_down, activation="silu"):
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            acc = torch.zeros_like(x[t])
            for j in range(topk_ids.shape[1]):
                e = int(topk_ids[t, j])
                up = F.linear(x[t], w_up[e])
                hidden = F.silu(F.linear(x[t], w_gate[e])) * up if activation == "silu" else F.relu(up) ** 2
                acc = acc + (F.linear(hidden, w_down[e]) * topk_weights[t, j]).to(x.dtype)
            out[t] = acc
        return out

    @staticmethod
    def _through_slots(store, state_slots, has_initial_state, run):
        """The per-slot contract (KernelSet.causal_conv1d): gather the rows (zeros where fresh), run,
        write the final states back in place and return the store."""
        if state_slots is None:
            return run(store)
        initial = store[state_slots].clone()
        if has_initial_state is not None:
            initial[~has_initial_state] = 0
        y, final = run(initial)
        store[state_slots] = final.to(store.dtype)
        return y, store

    def causal_conv1d(
        self,
        x,
        weight,
        bias,
        cu_seqlens,
        conv_state=None,
        activation="silu",
        state_slots=None,
        has_initial_state=None,
    ):
        return self._through_slots(
            conv_state,
            state_slots,
            has_initial_state,
            lambda state: self._causal_conv1d(x, weight, bias, cu_seqlens, state, activation),
        )

    def _causal_conv1d(self, x, weight, bias, cu_seqlens, conv_state, activation):
        width = weight.shape[1]
        outs, states = [], []
        for s in range(cu_seqlens.numel() - 1):
            xs = x[int(cu_seqlens[s]) : int(cu_seqlens[s + 1])].t()  # [C, L]
            prev = conv_state[s] if conv_state is not None else xs.new_zeros(xs.shape[0], width - 1)
            padded = torch.cat((prev.to(xs.dtype), xs), dim=1)
            y = F.conv1d(padded[None], weight[:, None, :], bias, groups=xs.shape[0])[0]
            outs.append((F.silu(y) if activation == "silu" else y).t())
            states.append(padded[:, -(width - 1) :])
        return torch.cat(outs), torch.stack(states)

    def ssm_scan(
        self,
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
        return self._through_slots(
            ssm_state,
            state_slots,
            has_initial_state,
            lambda state: self._ssm_scan(x, dt, A, B, C, D, dt_bias, cu_seqlens, state, dt_limit),
        )

    def _ssm_scan(self, x, dt, A, B, C, D, dt_bias, cu_seqlens, ssm_state, dt_limit):
        heads, head_dim = x.shape[1], x.shape[2]
        groups, state_size = B.shape[1], B.shape[2]
        rep = heads // groups
        outs, finals = [], []
        for s in range(cu_seqlens.numel() - 1):
            lo, hi = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
            if ssm_state is None:
                h = x.new_zeros(heads, head_dim, state_size, dtype=torch.float32)
            else:
                h = ssm_state[s].float()
            ys = []
            for t in range(lo, hi):
                step = F.softplus(dt[t].float() + dt_bias.float()).clamp(dt_limit[0], dt_limit[1])
                decay = torch.exp(step * A.float())
                b = B[t].float().repeat_interleave(rep, 0)  # [H, N]
                c = C[t].float().repeat_interleave(rep, 0)
                h = h * decay[:, None, None] + (step[:, None] * x[t].float())[:, :, None] * b[:, None, :]
                y = (h * c[:, None, :]).sum(-1) + D.float()[:, None] * x[t].float()
                ys.append(y.to(x.dtype))
            outs.append(torch.stack(ys))
            finals.append(h)
        return torch.cat(outs), torch.stack(finals)

    def quant_linear(self, x, qweight, bias=None):
        return F.linear(x, dequantize_reference(qweight).to(x.dtype), bias)
