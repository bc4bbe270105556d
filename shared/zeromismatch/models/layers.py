"""Building blocks shared by the model families; every floating-point op goes through a KernelSet.

Modules take ``(x, ctx)`` where ``x`` is packed ``[T, hidden]`` and ``ctx`` (``ForwardContext``)
carries the kernel set, the batch, the optional engine cache and the layer index. Model code
reshapes, slices, concatenates and indexes (embedding lookup, cache writes); matmuls, norms,
activations, softmax/attention, routing, conv and scan are kernel calls. The only arithmetic
left in model code is elementwise and row-local -- residual additions, the routed + shared
expert sum, Mamba2's ``A = -exp(A_log)``, an FP8 KV cache's e4m3 rounding (``kernels/quant.py``:
a cache format, one rule for every kernel set) -- so it gives the same bits for a token in any batch
(tests/models/test_kernel_routing.py audits this with a TorchFunctionMode).

Attention in trainer mode (``cache is None``) calls ``kernels.attention`` over the packed
sequences; in engine mode it first writes this step's K/V into the paged cache at
``batch.slot_mapping`` and then calls ``kernels.paged_attention`` over ``block_table`` /
``kv_lens``, so prefill, chunked prefill and decode are the same code path. With an FP8 KV cache
(``ModelCache.fp8``) the K/V are rounded through e4m3 before the write (``attend``).

Parameters keep Hugging Face names relative to their module (``q_proj.weight``,
``input_layernorm.weight``, ...), so the model's state dict *is* the HF state dict up to
the few transforms in ``causal_lm.py`` (stacked experts, tensor-parallel shards).

Fused projections (as vLLM's QKVParallelLinear / MergedColumnParallelLinear): q/k/v and
gate/up run as one ``kernels.linear`` over the concatenated weight (rows of the output are
the concatenated outputs), which saves GEMM calls per layer. With the aligned set this is
bit for bit the separate projections: the row-invariant GEMM gives every output column the
same bits whichever other columns share the call (``kernels/aligned/gemm.py``; checked in
tests/models/test_fused_projections.py). Engine and trainer run the same module code, so
they fuse identically in either set. The concatenated weight lives in the packed-weight cache
(``kernels/aligned/gemm.py::cached_from_weights``: kept while its sources are unchanged by
identity, storage and in-place version); under autograd it is concatenated on every call so
gradients reach the HF-named parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..kernels.base import KernelSet, QuantizedWeight
from ..kernels.quant import fp8_kv_roundtrip
from ..kernels.weight_cache import cached_from_weights
from .batch import ForwardBatch, ModelCache
from .tp import TensorParallel

#: K is cut into this many virtual shards in every row-parallel linear (TP degree must divide it)
VIRTUAL_SHARDS = 4


@dataclass
class ForwardContext:
    kernels: KernelSet
    batch: ForwardBatch
    cache: ModelCache | None
    layer_index: int = 0
    has_initial_state: torch.Tensor | None = None  # [S] bool, engine mode only

    @property
    def engine(self) -> bool:
        return self.cache is not None


class Linear(nn.Module):
    """``y = x W^T (+ b)``; parallel is "replicated", "column" (split out) or "row" (split in).

    After ``quantize_model`` the dense ``weight`` is gone and ``qweight`` (a QuantizedWeight of
    the full local shard) is used through ``kernels.quant_linear``. After ``fake_quantize_model``
    the ``weight`` Parameter stays (the learner's master) and ``fake_quant`` (models/quantized.py
    ``FakeQuantizer``) gives the weight the GEMM uses: ``kernels.linear(x, dequantize(quantize(W),
    x.dtype), b)``, which is what ``quant_linear`` computes in the aligned sets, row-parallel
    layers included (quantization needs TP 1)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, parallel: str, tp: TensorParallel):
        super().__init__()
        if parallel not in ("replicated", "column", "row"):
            raise ValueError(f"unknown parallel mode {parallel!r}")
        self.parallel, self.tp = parallel, tp
        out_local, in_local = out_features, in_features
        if parallel == "column":
            out_local = tp.local_size(out_features, "output features of a column-parallel linear")
        elif parallel == "row":
            in_local = tp.local_size(in_features, "input features of a row-parallel linear")
        self.weight = nn.Parameter(torch.empty(out_local, in_local))
        bias_size = out_local if parallel == "column" else out_features
        self.bias = nn.Parameter(torch.empty(bias_size)) if bias else None
        self.tp_dims = {
            "weight": {"column": 0, "row": 1}.get(parallel),
            "bias": 0 if parallel == "column" else None,
        }
        self.qweight: QuantizedWeight | None = None
        self.quant_format: str | None = None
        self.fake_quant = None  # a FakeQuantizer: (weight, dtype) -> the fake-quantized weight

    def forward(self, x: torch.Tensor, kernels: KernelSet) -> torch.Tensor:
        if self.qweight is not None:
            return kernels.quant_linear(x, self.qweight, self.bias)
        if self.fake_quant is not None:
            return kernels.linear(x, self.fake_quant(self.weight, x.dtype), self.bias)
        if self.parallel == "row":
            return kernels.row_parallel_linear(
                x, self.weight, self.bias, self.tp.reduce_group, VIRTUAL_SHARDS
            )
        return kernels.linear(x, self.weight, self.bias)


def fused_linear(x: torch.Tensor, kernels: KernelSet, linears: tuple[Linear, ...]) -> torch.Tensor | None:
    """``cat([l(x) for l in linears], -1)`` as one GEMM, or None when they cannot be fused
    (quantized or fake-quantized weights, row-parallel layouts, mixed biases). A fake-quantized
    learner runs its projections one by one, as the quantized engine model it must match does."""
    if any(lin.qweight is not None or lin.fake_quant is not None or lin.parallel == "row" for lin in linears):
        return None
    weights = tuple(lin.weight for lin in linears)
    biases = tuple(lin.bias for lin in linears)
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    weight, bias = _fused_weights(weights, biases)
    return kernels.linear(x, weight, bias)


def _fused_weights(weights: tuple[torch.Tensor, ...], biases: tuple[torch.Tensor | None, ...]):
    def concat():
        return torch.cat(weights), (torch.cat(biases) if biases[0] is not None else None)

    def build():
        weight, bias = concat()  # built under no_grad: plain tensors
        return (weight, bias), weight.nbytes + (0 if bias is None else bias.nbytes)

    # the packed-weight cache's staleness rules (tensor identity, storage, in-place version); it
    # declines weights that need a gradient now, which are then concatenated on every call
    sources = weights + tuple(b for b in biases if b is not None)
    cached = cached_from_weights(sources, ("concat", len(weights)), build)
    return concat() if cached is None else cached


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, kernels: KernelSet) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


class Embedding(nn.Module):
    """Token embedding table; the lookup is plain indexing (no arithmetic)."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[input_ids]


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))


def rope_inv_freq(dim: int, theta: float, rope_scaling: dict | None, what: str) -> torch.Tensor:
    """Default RoPE inverse frequencies, computed exactly as transformers does (fp32)."""
    if rope_scaling is not None:
        raise ValueError(
            f"{what}: rope_type {rope_scaling.get('rope_type')!r} is not supported by the model code "
            "(only default RoPE); the config can be represented but not instantiated"
        )
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def attend(
    ctx: ForwardContext, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of packed q ``[T, Hq, Dqk]`` over this layer's keys (trainer or engine)."""
    batch = ctx.batch
    if ctx.cache is None:
        return ctx.kernels.attention(q, k, v, batch.cu_seqlens_q, batch.cu_seqlens_q, scale)
    cache, layer = ctx.cache, ctx.layer_index
    k_cache, v_cache = cache.k_cache[layer], cache.v_cache[layer]
    slots = batch.slot_mapping
    # the cache holds values, not a graph: engine mode never backpropagates through it
    k, v = k.detach(), v.detach()
    if cache.fp8:
        # this step's K/V as an FP8 cache returns them; the step's own queries attend to the rounded
        # values too, as in vLLM's V1 backends, which read the new tokens back from the cache
        k, v = fp8_kv_roundtrip(k, cache.k_scale[layer]), fp8_kv_roundtrip(v, cache.v_scale[layer])
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))
    return ctx.kernels.paged_attention(
        q, k_cache, v_cache, batch.block_table, batch.cu_seqlens_q, batch.kv_lens, scale
    )


class Attention(nn.Module):
    """GQA self-attention (Qwen3 with q/k RMSNorm + RoPE; Nemotron-H without either)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        tp: TensorParallel,
        bias: bool,
        qk_norm_eps: float | None,
        inv_freq: torch.Tensor | None,
    ):
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = tp.local_size(num_heads, "num_attention_heads")
        self.num_kv_heads = tp.local_size(num_kv_heads, "num_key_value_heads")
        self.q_proj = Linear(hidden_size, num_heads * head_dim, bias, "column", tp)
        self.k_proj = Linear(hidden_size, num_kv_heads * head_dim, bias, "column", tp)
        self.v_proj = Linear(hidden_size, num_kv_heads * head_dim, bias, "column", tp)
        self.o_proj = Linear(num_heads * head_dim, hidden_size, bias, "row", tp)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.inv_freq = inv_freq  # plain fp32 tensor, not a buffer: dtype casts must not touch it
        self.scale = head_dim**-0.5

    def kv_cache_spec(self) -> tuple[int, int, int]:
        return self.num_kv_heads, self.head_dim, self.head_dim

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern, tokens = ctx.kernels, x.shape[0]
        hq, hkv = self.num_heads, self.num_kv_heads
        qkv = fused_linear(x, kern, (self.q_proj, self.k_proj, self.v_proj))
        if qkv is None:
            q = self.q_proj(x, kern).view(tokens, hq, self.head_dim)
            k = self.k_proj(x, kern).view(tokens, hkv, self.head_dim)
            v = self.v_proj(x, kern).view(tokens, hkv, self.head_dim)
        else:
            qkv = qkv.view(tokens, hq + 2 * hkv, self.head_dim)
            q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
        if self.q_norm is not None:
            q = self.q_norm(q, kern)
            k = self.k_norm(k, kern)
        if self.inv_freq is not None:
            # one call for q and k: rope is per (token, head, element), so stacking heads changes no bit
            qk = kern.rope(torch.cat((q, k), dim=1), ctx.batch.positions, self.inv_freq.to(device=q.device))
            q, k = qk[:, :hq], qk[:, hq:]
        out = attend(ctx, q, k, v, self.scale)
        return self.o_proj(out.reshape(tokens, -1), kern)


class GatedMLP(nn.Module):
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))`` (Qwen3, DeepSeek dense and shared experts)."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp: TensorParallel):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, False, "column", tp)
        self.up_proj = Linear(hidden_size, intermediate_size, False, "column", tp)
        self.down_proj = Linear(intermediate_size, hidden_size, False, "row", tp)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern = ctx.kernels
        gate_up = fused_linear(x, kern, (self.gate_proj, self.up_proj))
        if gate_up is None:
            gate, up = self.gate_proj(x, kern), self.up_proj(x, kern)
        else:
            width = gate_up.shape[-1] // 2
            gate, up = gate_up[..., :width], gate_up[..., width:]
        return self.down_proj(kern.silu_mul(gate, up), kern)


class Relu2MLP(nn.Module):
    """Nemotron-H MLP: ``down(relu(up(x))^2)``, no gate."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, tp: TensorParallel):
        super().__init__()
        self.up_proj = Linear(hidden_size, intermediate_size, bias, "column", tp)
        self.down_proj = Linear(intermediate_size, hidden_size, bias, "row", tp)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern = ctx.kernels
        return self.down_proj(kern.relu2(self.up_proj(x, kern)), kern)


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def kv_cache_spec(self):
        return self.self_attn.kv_cache_spec()

    def state_cache_spec(self):
        return None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern = ctx.kernels
        x = x + self.self_attn(self.input_layernorm(x, kern), ctx)
        return x + self.mlp(self.post_attention_layernorm(x, kern), ctx)
