"""A tiny stand-in model for engine tests that must not depend on the real model zoo.

One embedding, one single-head causal attention layer reading the paged KV cache in
engine mode, one lm_head. ``invariant=True`` computes every row on its own (padded
row-invariant GEMMs, one attention query at a time), so a token's numbers depend only
on its prefix -- a miniature of the aligned contract; ``invariant=False`` uses batched
``F.linear`` and batched attention, whose bits depend on how many rows share a call
(its inverse). ``ToyKernels`` supplies the two logprob ops the engine's sampler needs.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from zeromismatch.models.batch import ForwardBatch, ModelCache


def row_invariant_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # Measured on this CPU: F.linear rows are M-independent once M >= 16 (see COMMON notes).
    m = x.shape[0]
    if m >= 16:
        return F.linear(x, weight)
    padded = x.new_zeros(16, x.shape[1])
    padded[:m] = x
    return F.linear(padded, weight)[:m]


class ToyKernels:
    """Reference sampler ops, one row at a time (row-independent by construction)."""

    name = "toy"

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        return (
            torch.stack([torch.log_softmax(row.float(), dim=-1) for row in logits]) if len(logits) else logits
        )

    def processed_log_softmax(self, logits, temperature, top_k, top_p):
        rows = []
        for row, t, k, p in zip(logits.float(), temperature.tolist(), top_k.tolist(), top_p.tolist()):
            if t == 0.0:
                out = torch.full_like(row, float("-inf"))
                out[int(torch.argmax(row))] = 0.0
                rows.append(out)
                continue
            scaled = row / t
            order = torch.sort(scaled, descending=True, stable=True).indices
            keep = torch.zeros_like(row, dtype=torch.bool)
            sorted_vals = scaled[order]
            kept = len(order) if k <= 0 else min(k, len(order))
            probs = torch.softmax(sorted_vals[:kept], dim=-1)
            cum = torch.cumsum(probs, 0)
            n_p = int((cum - probs < p).sum()) if p < 1.0 else kept
            keep[order[: max(1, n_p)]] = True
            masked = scaled.masked_fill(~keep, float("-inf"))
            rows.append(torch.log_softmax(masked, dim=-1))
        return torch.stack(rows) if rows else logits.float()


class ToyModel:
    supports_prefix_caching = True

    def __init__(self, vocab_size=48, hidden=32, max_positions=128, invariant=True, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.config = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=max_positions)
        self.hidden = hidden
        self.invariant = invariant
        shapes = {
            "embed": (vocab_size, hidden),
            "pos": (max_positions, hidden),
            "wq": (hidden, hidden),
            "wk": (hidden, hidden),
            "wv": (hidden, hidden),
            "wo": (hidden, hidden),
            "lm_head": (vocab_size, hidden),
        }
        self.params = {n: torch.randn(s, generator=gen) * 0.5 for n, s in shapes.items()}
        self.kernels = ToyKernels()

    # -- the model API the engine uses ------------------------------------
    def set_kernels(self, kernels) -> None:
        if not isinstance(kernels, ToyKernels):
            raise ValueError("the toy model runs only with ToyKernels")

    def state_dict_hf(self):
        return {n: t.clone() for n, t in self.params.items()}

    def load_state_dict_hf(self, sd):
        self.params = {n: sd[n].clone() for n in self.params}

    def allocate_cache(self, num_blocks, block_size, max_seqs, dtype=None):
        shape = (num_blocks, block_size, 1, self.hidden)
        return ModelCache(block_size, num_blocks, [torch.zeros(shape)], [torch.zeros(shape)], [None], [None])

    def _linear(self, x, w):
        return row_invariant_linear(x, w) if self.invariant else F.linear(x, w)

    def forward(self, batch: ForwardBatch, cache: ModelCache | None):
        p = self.params
        x = p["embed"][batch.input_ids] + p["pos"][batch.positions]
        q, k, v = self._linear(x, p["wq"]), self._linear(x, p["wk"]), self._linear(x, p["wv"])
        scale = self.hidden**-0.5
        cu = batch.cu_seqlens_q.tolist()
        outputs = []
        for s in range(batch.num_seqs):
            lo, hi = cu[s], cu[s + 1]
            kv_len = int(batch.kv_lens[s])
            if cache is None:
                keys, values = k[lo:hi], v[lo:hi]
            else:
                bs = cache.block_size
                flat_k = cache.k_cache[0].view(-1, self.hidden)
                flat_v = cache.v_cache[0].view(-1, self.hidden)
                flat_k[batch.slot_mapping[lo:hi]] = k[lo:hi]
                flat_v[batch.slot_mapping[lo:hi]] = v[lo:hi]
                pos = torch.arange(kv_len)
                slots = batch.block_table[s][pos // bs] * bs + pos % bs
                keys, values = flat_k[slots], flat_v[slots]
            first = kv_len - (hi - lo)
            if self.invariant:
                for j in range(hi - lo):
                    n = first + j + 1
                    w = torch.softmax(torch.mv(keys[:n], q[lo + j]) * scale, 0)
                    outputs.append(torch.mv(values[:n].t().contiguous(), w))
            else:
                scores = q[lo:hi] @ keys.t() * scale
                mask = torch.arange(kv_len)[None, :] > (first + torch.arange(hi - lo))[:, None]
                w = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
                outputs.extend((w @ values).unbind(0))
        attn = torch.stack(outputs)
        return x + self._linear(attn, p["wo"])

    def compute_logits(self, hidden):
        return self._linear(hidden.float(), self.params["lm_head"])
