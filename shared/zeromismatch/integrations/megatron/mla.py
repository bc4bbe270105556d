"""DeepSeek-V3 Multi-head Latent Attention as a spec'd Megatron module, on the KernelSet.

Megatron's ``MLASelfAttention`` applies its own RoPE (``RotaryEmbedding`` / ``YarnRotaryEmbedding``,
torch cos/sin) inside ``get_query_key_value_tensors`` and scales the softmax by its YaRN mscale, so
it cannot run the project's arithmetic through a core-attention slot the way ``SelfAttention`` does.
``KernelMLASelfAttention`` takes the ``self_attention`` slot of ``TransformerLayer`` instead: it
keeps Megatron's MLA submodule names and parallel layout (``MLASelfAttentionSubmodules``:
``linear_q_down_proj`` / ``linear_kv_down_proj`` replicated on every rank, ``linear_q_up_proj`` /
``linear_kv_up_proj`` column-parallel by heads, ``q_layernorm`` / ``kv_layernorm``, the row-parallel
``linear_proj``), built from the spec, and computes exactly ``models.mla.MLAttention.forward``:

``q = q_up(q_norm(q_down(x)))`` (or ``linear_q_proj(x)`` without ``q_lora_rank``) split per head into
``[q_nope, q_rope]``; ``[c_kv, k_rope] = kv_down(x)``; ``rope_interleave`` gathers the even then the
odd dims; ``kernels.rope`` on q_rope and on the one shared k_rope (two calls, as the project makes
them); ``[k_nope, v] = kv_up(kv_norm(c_kv))``; ``kernels.attention`` over ``[q_nope, q_rope]`` /
``[k_nope, k_rope]`` with scale ``qk_head_dim ** -0.5``; ``linear_proj``.

Tensor parallelism: a rank holds its heads of q_up / kv_up / linear_proj; the down projections and
their norms are computed whole on every rank. Their output gradients are complete on every rank
(the column-parallel up projections all-reduce their input gradients) except k_rope's, which each
rank uses for its own heads only: it passes through Megatron's copy-to-TP-region op (identity
forward, all-reduce of the gradient backward).
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module

from .attention import token_layout
from .layers import KernelSlot


class KernelMLASelfAttention(MegatronModule):
    """``self_attention`` of a DeepSeek-V3 ``TransformerLayer``: MLA on the KernelSet."""

    def __init__(
        self, config, submodules, layer_number: int, attn_mask_type=None, cp_comm_type=None,
        pg_collection=None, *, kernels: KernelSlot, dims: dict, inv_freq: torch.Tensor,
        rope_interleave: bool, low_rank_eps: float,
    ):  # fmt: skip
        super().__init__(config=config)
        self.slot = kernels
        self.layer_number = layer_number
        tp = pg_collection.tp if pg_collection is not None else None
        heads, hidden = config.num_attention_heads, config.hidden_size
        self.tp_size = config.tensor_model_parallel_size
        self.heads = heads // self.tp_size
        self.nope, self.rope_dim = dims["qk_nope_head_dim"], dims["qk_rope_head_dim"]
        self.qk_head_dim, self.v_head_dim = self.nope + self.rope_dim, dims["v_head_dim"]
        self.kv_lora_rank, q_lora_rank = dims["kv_lora_rank"], dims["q_lora_rank"]
        self.inv_freq = inv_freq  # plain fp32 tensor, not a buffer: dtype casts must not touch it
        self.rope_interleave = rope_interleave
        self.scale = self.qk_head_dim**-0.5

        def column(spec, n_in, n_out):
            return build_module(
                spec, n_in, n_out, config=config, init_method=config.init_method, gather_output=False,
                bias=False, skip_bias_add=False, is_expert=False, tp_group=tp,
            )  # fmt: skip

        def replicated(spec, n_in, n_out):
            return build_module(spec, n_in, n_out, config=config)

        def norm(spec, size):
            return build_module(spec, config=config, hidden_size=size, eps=low_rank_eps)

        if q_lora_rank is None:
            self.linear_q_proj = column(submodules.linear_q_proj, hidden, heads * self.qk_head_dim)
        else:
            self.linear_q_down_proj = replicated(submodules.linear_q_down_proj, hidden, q_lora_rank)
            self.q_layernorm = norm(submodules.q_layernorm, q_lora_rank)
            self.linear_q_up_proj = column(submodules.linear_q_up_proj, q_lora_rank, heads * self.qk_head_dim)
        self.q_lora_rank = q_lora_rank
        self.linear_kv_down_proj = replicated(
            submodules.linear_kv_down_proj, hidden, self.kv_lora_rank + self.rope_dim
        )
        self.kv_layernorm = norm(submodules.kv_layernorm, self.kv_lora_rank)
        self.linear_kv_up_proj = column(
            submodules.linear_kv_up_proj, self.kv_lora_rank, heads * (self.nope + self.v_head_dim)
        )
        self.linear_proj = build_module(
            submodules.linear_proj, heads * self.v_head_dim, hidden, config=config,
            init_method=config.output_layer_init_method, bias=False, input_is_parallel=True,
            skip_bias_add=True, is_expert=False, tp_group=tp,
        )  # fmt: skip

    def forward(self, hidden_states, attention_mask=None, attention_bias=None, packed_seq_params=None,
                **_unused):  # fmt: skip
        if attention_mask is not None or attention_bias is not None:
            raise ValueError(
                "KernelMLASelfAttention applies the causal mask itself: pass attention_mask=None and "
                "no attention_bias (padded batches must be right-padded)"
            )
        x, cu, positions, restore = token_layout(hidden_states, packed_seq_params)
        out = self._mla(x, cu, positions.to(x.device))
        return restore(out), None

    def _mla(self, x: torch.Tensor, cu: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        kern, tokens, heads = self.slot.kernels, x.shape[0], self.heads
        if self.q_lora_rank is None:
            q, _ = self.linear_q_proj(x)
        else:
            down, _ = self.linear_q_down_proj(x)
            q, _ = self.linear_q_up_proj(self.q_layernorm(down))
        q = q.view(tokens, heads, self.qk_head_dim)
        q_nope, q_rope = q[..., : self.nope], q[..., self.nope :]

        compressed, _ = self.linear_kv_down_proj(x)
        latent = self.kv_layernorm(compressed[:, : self.kv_lora_rank])
        k_rope = compressed[:, self.kv_lora_rank :].reshape(tokens, 1, self.rope_dim)
        if self.tp_size > 1 and torch.is_grad_enabled() and k_rope.requires_grad:
            k_rope = copy_to_tensor_model_parallel_region(k_rope)  # used by this rank's heads only
        if self.rope_interleave:  # even dims, then odd dims (models/mla.py)
            q_rope = torch.cat((q_rope[..., 0::2], q_rope[..., 1::2]), dim=-1)
            k_rope = torch.cat((k_rope[..., 0::2], k_rope[..., 1::2]), dim=-1)
        inv_freq = self.inv_freq.to(device=q.device)
        q_rope = kern.rope(q_rope.contiguous(), positions, inv_freq)
        k_rope = kern.rope(k_rope.contiguous(), positions, inv_freq)

        kv, _ = self.linear_kv_up_proj(latent)
        kv = kv.view(tokens, heads, self.nope + self.v_head_dim)
        k_nope, v = kv[..., : self.nope], kv[..., self.nope :]
        k = torch.cat((k_nope, k_rope.expand(tokens, heads, self.rope_dim)), dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        out = kern.attention(q, k, v.contiguous(), cu, cu, self.scale)
        projected, _ = self.linear_proj(out.reshape(tokens, heads * self.v_head_dim))
        return projected
