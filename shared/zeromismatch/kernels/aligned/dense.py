"""Aligned dense ops: each output row depends only on that row's inputs.

- GEMMs go through ``gemm.row_invariant_linear`` (fixed kernel per row, see gemm.py);
  tensor-parallel row-parallel GEMMs through ``collectives.virtual_shard_reduce``.
- Row reductions (RMSNorm) are computed per row; rows of >= ``_SPLIT_ROW`` elements are
  first cut into a fixed number of chunks, because torch splits a *single* long row
  across threads (a two-pass reduction) but not one of many rows.
- SiLU is composed as ``g / (1 + exp(-g))``: torch's fused ``silu``/``sigmoid`` kernels
  run their vector body on most elements and a scalar ``std::exp`` on the tail of the
  buffer, so an element's bits depend on where it sits in the batch. ``exp`` runs through
  torch's VML path (partial vectors for the tail) and +, /, * are correctly rounded, so
  the composition is position-independent.
- lm_head and log_softmax are fp32 on both sides; ``processed_log_softmax`` is the one
  definition of the sampler's distribution (the default set imports it too).
"""

from __future__ import annotations

import torch

from .. import collectives
from ..base import QuantizedWeight
from ..quant import cached_dequantize
from .gemm import row_invariant_linear

# torch reduces a single output over >= 32768 elements (at::internal::GRAIN_SIZE) in two
# parallel passes; many outputs are reduced one per thread.
_SPLIT_ROW = 32768
_ROW_CHUNKS = 16


def _check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2:
        raise ValueError(f"weight must be [out, in], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x last dim {tuple(x.shape)[-1:]} does not match weight in-dim {weight.shape[1]}")
    if x.dtype != weight.dtype:
        raise TypeError(f"x dtype {x.dtype} != weight dtype {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    _check_linear(x, weight, bias)
    out = row_invariant_linear(x.reshape(-1, x.shape[-1]), weight)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def row_parallel_linear(
    x_local: torch.Tensor,
    weight_local: torch.Tensor,
    bias: torch.Tensor | None = None,
    group=None,
    virtual_shards: int = 4,
) -> torch.Tensor:
    _check_linear(x_local, weight_local, None)
    x2d = x_local.reshape(-1, x_local.shape[-1])
    out = collectives.virtual_shard_reduce(x2d, weight_local, group, virtual_shards, row_invariant_linear)
    out = out.to(x_local.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x_local.shape[:-1], weight_local.shape[0])


def _row_mean_of_squares(xf: torch.Tensor) -> torch.Tensor:
    """mean(xf^2) over the last dim, with a reduction structure that depends only on its length."""
    h = xf.shape[-1]
    sq = xf * xf
    if h < _SPLIT_ROW:
        return sq.sum(-1, keepdim=True) / h
    pad = (-h) % _ROW_CHUNKS
    if pad:
        sq = torch.nn.functional.pad(sq, (0, pad))
    chunked = sq.reshape(*sq.shape[:-1], _ROW_CHUNKS, -1).sum(-1)
    return chunked.sum(-1, keepdim=True) / h


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm weight shape {tuple(weight.shape)} != x last dim {x.shape[-1]}")
    xf = x.float()
    normed = xf * torch.rsqrt(_row_mean_of_squares(xf) + eps)
    return weight * normed.to(x.dtype)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _silu_f32(gate: torch.Tensor) -> torch.Tensor:
    """fp32 ``g / (1 + exp(-g))`` of ``gate`` (fp32 or bf16), in place in one fresh fp32 buffer
    (negation and bf16 -> fp32 are exact, so the passes below equal the textbook formula).
    Under autograd the same operations run out of place."""
    if _needs_grad(gate):
        gf = gate.float()
        return gf / (torch.exp(-gf) + 1.0)
    if gate.dtype == torch.float32:
        t = torch.neg(gate)
    else:
        t = gate.to(torch.float32)
        t.neg_()
    t.exp_()
    t.add_(1.0)
    return torch.div(gate, t, out=t)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int
) -> torch.Tensor:
    if gate.shape != x.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"gated_rms_norm weight shape {tuple(weight.shape)} != x last dim {x.shape[-1]}")
    if group_size <= 0 or x.shape[-1] % group_size != 0:
        raise ValueError(f"group_size {group_size} must be positive and divide {x.shape[-1]}")
    silu = _silu_f32(gate)
    hidden = silu * x if _needs_grad(gate, x) else silu.mul_(x)
    grouped = hidden.reshape(*hidden.shape[:-1], -1, group_size)
    normed = grouped * torch.rsqrt(_row_mean_of_squares(grouped) + eps)
    return weight * normed.reshape(hidden.shape).to(x.dtype)


def rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    if x.dim() != 3 or x.shape[-1] % 2 != 0:
        raise ValueError(f"rope needs x [T, H, D_rot] with even D_rot, got {tuple(x.shape)}")
    if positions.shape != x.shape[:1]:
        raise ValueError(f"positions shape {tuple(positions.shape)} != [T]={x.shape[0]}")
    half = x.shape[-1] // 2
    if inv_freq.shape != (half,):
        raise ValueError(f"inv_freq must have shape ({half},), got {tuple(inv_freq.shape)}")
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    cos = torch.cos(angles)[:, None, :]
    sin = torch.sin(angles)[:, None, :]
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape != up.shape:
        raise ValueError(f"gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise TypeError(f"gate dtype {gate.dtype} != up dtype {up.dtype}")
    silu = _silu_f32(gate)
    t = silu * up if _needs_grad(gate, up) else silu.mul_(up)
    return t if gate.dtype == torch.float32 else t.to(gate.dtype)


def relu2(x: torch.Tensor) -> torch.Tensor:
    r = torch.relu(x)
    return r * r


_CAST_CACHE: dict[int, tuple[torch.Tensor, int, torch.dtype, torch.Tensor]] = {}
_CACHE_LIMIT = 4


def _cached_cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight.to(dtype)``, cached while the weight is unchanged (in-place updates bump
    ``_version``) and no gradient is needed, so a decode step does not re-upcast the head.
    The entry holds the weight itself, so its id cannot be reused while cached. Inference
    tensors have no version counter, so they are cast on every call instead."""
    if weight.dtype == dtype:
        return weight
    if (torch.is_grad_enabled() and weight.requires_grad) or weight.is_inference():
        return weight.to(dtype)
    hit = _CAST_CACHE.get(id(weight))
    if hit is not None and hit[0] is weight and hit[1] == weight._version and hit[2] == dtype:
        return hit[3]
    if len(_CAST_CACHE) >= _CACHE_LIMIT:
        _CAST_CACHE.pop(next(iter(_CAST_CACHE)))
    cast = weight.detach().to(dtype)
    _CAST_CACHE[id(weight)] = (weight, weight._version, dtype, cast)
    return cast


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"lm_head: hidden {tuple(hidden.shape)} vs weight {tuple(weight.shape)}")
    h2d = hidden.reshape(-1, hidden.shape[-1]).float()
    return row_invariant_linear(h2d, _cached_cast(weight, torch.float32))


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    # torch's log_softmax kernel reduces each row on one thread, whatever the row count
    return torch.log_softmax(logits.float(), dim=-1)


def _check_sampling(logits: torch.Tensor, temperature, top_k, top_p) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, V], got {tuple(logits.shape)}")
    t = logits.shape[0]
    for name, p in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if not isinstance(p, torch.Tensor) or p.shape != (t,):
            raise ValueError(f"{name} must be a tensor of shape [{t}], got {getattr(p, 'shape', type(p))}")
    if bool((temperature < 0).any()) or not bool(torch.isfinite(temperature).all()):
        raise ValueError("temperature must be finite and >= 0 (0 = greedy)")
    if bool(((top_p <= 0) | (top_p > 1)).any()):
        raise ValueError("top_p must be in (0, 1]")


def processed_log_softmax(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Logprobs of the sampler's distribution; the single definition engine and trainer share.

    Per row: divide by temperature (0 = greedy: logprob 0 at the argmax, lowest id on ties,
    -inf elsewhere); keep the top_k largest (<= 0 = off), ties ordered by lower token id
    (stable descending sort); then keep the smallest prefix of that order whose probability
    (softmax of the kept logits) reaches top_p (1 = off; the first token is always kept);
    masked entries are -inf and the rest renormalised by a log_softmax taken in *token*
    order, so a row with no filtering is exactly ``log_softmax(logits / t)``.
    """
    _check_sampling(logits, temperature, top_k, top_p)
    lf = logits.float()
    n_rows, vocab = lf.shape
    temp = temperature.to(torch.float32)
    greedy = temp == 0
    scaled = lf / torch.where(greedy, torch.ones_like(temp), temp)[:, None]

    k_eff = top_k.to(torch.int64)
    k_eff = torch.where((k_eff <= 0) | (k_eff > vocab), torch.full_like(k_eff, vocab), k_eff)
    p = top_p.to(torch.float32)
    filtered = ~greedy & ((k_eff < vocab) | (p < 1))
    if bool(filtered.any()):
        # rows are independent below; sorting only the rows that filter changes no row's bits
        rows = filtered.nonzero().squeeze(1)
        sub = scaled[rows]
        sorted_vals, order = torch.sort(sub, dim=-1, descending=True, stable=True)
        rank = torch.arange(vocab, device=lf.device)[None, :]
        keep_sorted = rank < k_eff[rows][:, None]
        masked_sorted = sorted_vals.masked_fill(~keep_sorted, float("-inf"))
        probs = torch.softmax(masked_sorted, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep_p = (mass_before < p[rows][:, None]) | (p[rows][:, None] >= 1) | (rank == 0)
        keep_sorted &= keep_p
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        scaled = scaled.clone()
        scaled[rows] = sub.masked_fill(~keep, float("-inf"))

    out = torch.log_softmax(scaled, dim=-1)
    if bool(greedy.any()):
        rows = greedy.nonzero().squeeze(1)
        best = torch.argmax(lf[rows], dim=-1)  # first (lowest-id) maximum
        one_hot = torch.full((rows.numel(), vocab), float("-inf"), device=lf.device)
        one_hot.scatter_(1, best[:, None], 0.0)
        out[rows] = one_hot
    return out


def quant_linear(x: torch.Tensor, qweight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Weight-only quantization: dequantize (elementwise, deterministic) then the row-invariant
    GEMM. Activations are not quantized, so no scale ever spans the batch."""
    if not isinstance(qweight, QuantizedWeight):
        raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
    return linear(x, cached_dequantize(qweight, x.dtype), bias)
