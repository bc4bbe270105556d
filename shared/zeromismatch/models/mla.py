"""DeepSeek-V3 Multi-head Latent Attention (MLA), on the KernelSet.

Per token: ``q = q_b(rmsnorm(q_a(x)))`` (or ``q_proj(x)`` when ``q_lora_rank`` is null), split
per head into a no-RoPE part and a RoPE part; ``[c_kv, k_rope] = kv_a_proj_with_mqa(x)`` with
``c_kv`` the ``kv_lora_rank`` latent (RMS-normed) and ``k_rope`` one RoPE key shared by all
heads; ``[k_nope, v] = kv_b(c_kv)`` per head. Keys are ``[k_nope, k_rope]``, queries
``[q_nope, q_rope]``, softmax scale ``qk_head_dim ** -0.5``.

``rope_interleave`` (DeepSeek's checkpoint layout pairs dims (2i, 2i+1)): transformers rotates
the even/odd slices and writes the result de-interleaved (evens first). Gathering the
even then odd dims and applying the ordinary rotate-half RoPE is the same computation, so we
do that (the even then the odd dims, concatenated, plus ``kernels.rope(interleaved=False)``) and match
transformers' layout exactly.

Deviation from vLLM (documented on purpose): vLLM caches the compressed latent
``[c_kv, k_rope]`` (kv_lora_rank + rope dims per token) and absorbs ``kv_b`` into the query and
output projections at decode time. That changes the operation order between prefill and
decode. Here the paged cache holds the *decompressed* per-head K ``[H, qk_head_dim]`` and V
``[H, v_head_dim]``, so decode runs exactly the attention that the trainer runs: more cache
memory (``H * (qk_head_dim + v_head_dim)`` instead of ``kv_lora_rank + qk_rope_head_dim`` per
token), one code path. The q/kv low-rank RMSNorms use eps 1e-6 as transformers' MLA does.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .layers import ForwardContext, Linear, RMSNorm, attend, rope_inv_freq
from .tp import TensorParallel

_LOW_RANK_NORM_EPS = 1e-6


class MLAttention(nn.Module):
    def __init__(self, config: ModelConfig, tp: TensorParallel):
        super().__init__()
        heads = config.num_attention_heads
        self.num_heads = tp.local_size(heads, "num_attention_heads")
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.qk_head_dim, self.v_head_dim = config.qk_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        hidden, bias = config.hidden_size, config.attention_bias
        if config.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * self.qk_head_dim, False, "column", tp)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = Linear(hidden, config.q_lora_rank, bias, "replicated", tp)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, _LOW_RANK_NORM_EPS)
            self.q_b_proj = Linear(config.q_lora_rank, heads * self.qk_head_dim, False, "column", tp)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope_dim, bias, "replicated", tp)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LOW_RANK_NORM_EPS)
        self.kv_b_proj = Linear(
            self.kv_lora_rank, heads * (self.nope_dim + self.v_head_dim), False, "column", tp
        )
        self.o_proj = Linear(heads * self.v_head_dim, hidden, bias, "row", tp)
        self.inv_freq = rope_inv_freq(self.rope_dim, config.rope_theta, config.rope_scaling, config.family)
        self.scale = self.qk_head_dim**-0.5
        self.rope_interleave = bool(config.rope_interleave)

    def kv_cache_spec(self) -> tuple[int, int, int]:
        return self.num_heads, self.qk_head_dim, self.v_head_dim

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kern, tokens, heads = ctx.kernels, x.shape[0], self.num_heads
        if self.q_proj is not None:
            q = self.q_proj(x, kern)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x, kern), kern), kern)
        q = q.view(tokens, heads, self.qk_head_dim)
        q_nope, q_rope = q[..., : self.nope_dim], q[..., self.nope_dim :]

        compressed = self.kv_a_proj_with_mqa(x, kern)
        latent = self.kv_a_layernorm(compressed[:, : self.kv_lora_rank], kern)
        k_rope = compressed[:, self.kv_lora_rank :].reshape(tokens, 1, self.rope_dim)
        if self.rope_interleave:  # even dims, then odd dims: strided copies (a step graph's are native)
            q_rope = torch.cat((q_rope[..., 0::2], q_rope[..., 1::2]), dim=-1)
            k_rope = torch.cat((k_rope[..., 0::2], k_rope[..., 1::2]), dim=-1)
        inv_freq = self.inv_freq.to(device=q.device)
        q_rope = kern.rope(q_rope.contiguous(), ctx.batch.positions, inv_freq)
        k_rope = kern.rope(k_rope.contiguous(), ctx.batch.positions, inv_freq)

        kv = self.kv_b_proj(latent, kern).view(tokens, heads, self.nope_dim + self.v_head_dim)
        k_nope, v = kv[..., : self.nope_dim], kv[..., self.nope_dim :]
        k = torch.cat((k_nope, k_rope.expand(tokens, heads, self.rope_dim)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        out = attend(ctx, q, k, v.contiguous(), self.scale)
        return self.o_proj(out.reshape(tokens, heads * self.v_head_dim), kern)
