"""The core attention of the Megatron layer specs: the KernelSet's ``rope`` then ``attention``.

Megatron's ``SelfAttention`` computes q/k/v (its fused, per-query-group interleaved ``linear_qkv``),
applies the q/k norms, and hands this module this rank's heads. Megatron's own RoPE is off
(``position_embedding_type="none"``), so the rotation happens here, on the KernelSet, exactly as
the project's ``models.layers.Attention`` does it: one ``rope`` call on q and k stacked by head,
then causal ``attention`` over packed sequences.

Two input layouts, Megatron's two:
- ``thd`` (``PackedSeqParams(qkv_format="thd")``): q ``[t, heads, d]``, sequences packed by
  ``cu_seqlens_q``; positions restart at 0 in every sequence (``KernelPackedSeqParams`` may carry
  them precomputed).
- ``sbhd`` (no packed params): q ``[s, b, heads, d]``, every row of the batch one sequence starting
  at position 0 and right-padded to ``s``. Causal attention never lets a token see the padding
  after it, so a padded row's real tokens get the bits of the unpadded sequence.
Only the causal mask is supported (``attention_mask`` must be None, no ``attention_bias``): the
learner's sequences are complete and causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from .layers import KernelSlot


@dataclass
class KernelPackedSeqParams(PackedSeqParams):
    """``PackedSeqParams`` plus each token's position in its sequence (computed once per forward,
    not once per layer)."""

    positions: torch.Tensor | None = None


def positions_from_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[0, 1, .., n_0 - 1, 0, 1, .., n_1 - 1, ...]`` for packed sequences with offsets ``cu_seqlens``."""
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    total = int(cu[-1])
    return torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(cu[:-1], lens)


def token_layout(hidden_states: torch.Tensor, packed_seq_params):
    """A layer input ``[s, b, h]`` as packed tokens ``[T, h]`` with its sequence offsets, positions and
    the map back: ``thd`` (``b == 1``, sequences packed by ``cu_seqlens_q``) or ``sbhd`` (each of the
    ``b`` rows one sequence from position 0, right-padded to ``s``)."""
    if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
        cu = packed_seq_params.cu_seqlens_q
        positions = getattr(packed_seq_params, "positions", None)
        if positions is None:
            positions = positions_from_offsets(cu)
        return hidden_states[:, 0], cu, positions, lambda out: out[:, None]
    seq, batch = hidden_states.shape[:2]
    x = hidden_states.transpose(0, 1).reshape(batch * seq, hidden_states.shape[-1])
    cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int64)
    positions = torch.arange(seq, dtype=torch.int64).repeat(batch)
    return x, cu, positions, lambda out: out.reshape(batch, seq, -1).transpose(0, 1)


class KernelCoreAttention(MegatronModule):
    """``core_attention`` for ``SelfAttention``: RoPE + causal attention on the KernelSet."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        cp_comm_type=None,
        softmax_scale: float | None = None,
        pg_collection=None,
        *,
        kernels: KernelSlot,
        inv_freq: torch.Tensor | None,
        interleaved: bool = False,
    ):
        super().__init__(config=config)
        if attn_mask_type != AttnMaskType.causal or attention_type != "self":
            raise ValueError(f"KernelCoreAttention is causal self-attention only, got {attn_mask_type}")
        self.slot = kernels
        self.inv_freq = inv_freq  # plain fp32 tensor, not a buffer: dtype casts must not touch it
        self.interleaved = interleaved
        self.scale = softmax_scale if softmax_scale is not None else config.kv_channels**-0.5

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
        packed_seq_params=None,
    ):  # fmt: skip
        if attention_mask is not None or attention_bias is not None:
            raise ValueError(
                "KernelCoreAttention applies the causal mask itself: pass attention_mask=None and no "
                "attention_bias (padded batches must be right-padded)"
            )
        thd = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        if thd:
            q, k, v = query, key, value
            cu = packed_seq_params.cu_seqlens_q
            positions = getattr(packed_seq_params, "positions", None)
            if positions is None:
                positions = positions_from_offsets(cu)
        else:
            seq, batch = query.shape[:2]
            q, k, v = (t.transpose(0, 1).reshape(batch * seq, *t.shape[2:]) for t in (query, key, value))
            cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int64)
            positions = torch.arange(seq, dtype=torch.int64).repeat(batch)
        out = self._attend(q, k, v, cu, positions.to(q.device))
        if thd:
            return out.reshape(out.shape[0], -1)
        return out.reshape(batch, seq, -1).transpose(0, 1)

    def _attend(self, q, k, v, cu, positions):
        kern, heads = self.slot.kernels, q.shape[1]
        if self.inv_freq is not None:
            # one call for q and k, as the project's attention makes it (rope is per element)
            qk = kern.rope(torch.cat((q, k), dim=1), positions, self.inv_freq.to(q.device), self.interleaved)
            q, k = qk[:, :heads], qk[:, heads:]
        return kern.attention(q, k, v, cu, cu, self.scale)
