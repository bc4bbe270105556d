"""The plugin's attention backend: vLLM allocates and schedules the paged KV cache, the project's
kernels read and write it.

The wrapper model registers one vLLM ``Attention`` layer per attention layer of the project model
with this backend, only so that vLLM sizes, allocates, binds and block-manages a KV cache for it
(vLLM finds KV-cache layers through ``Attention`` modules). The backend is vLLM's CPU backend with
two things changed:

* its metadata builder skips the CPU kernel's scheduler metadata (a C++ work split for
  ``cpu_attention_with_kv_cache``, which never runs here) and keeps the fields the project needs:
  ``query_start_loc``, ``seq_lens``, ``block_table``, ``slot_mapping``;
* its impl is never called: the project model's own attention (``models/layers.py::attend``)
  writes this step's K/V at the slot mapping and calls ``kernels.paged_attention`` over the block
  table, exactly the code the project's engine runs, so the bits are the engine's.

Cache layout. The CPU backend's per-layer cache is ``[num_blocks, Hkv, block_size, 2 * D]``
(layout LBHNC, one contiguous page per block); only this plugin reads or writes it, so the page's
bytes may be laid out as the project's kernels want them: token-major rows ``[block_size, Hkv, D]``
of K, then the same of V. Viewed as ``[2 * num_blocks, block_size, Hkv, D]``, vLLM block ``b`` is
project block ``2b`` (its K) followed by ``2b + 1`` (its V); K reads the view from block 0, V from
block 1, so one translated block table ``2 * table`` addresses both, and both views are contiguous
(the aligned kernel reads rows of the cache without copying it). vLLM slot ``b * N + o`` becomes
``2b * N + o``.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)


class ZeroMismatchAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        md = common_attn_metadata
        return CPUAttentionMetadata(
            num_actual_tokens=md.num_actual_tokens,
            max_query_len=md.max_query_len,
            query_start_loc=md.query_start_loc,
            max_seq_len=md.max_seq_len,
            seq_lens=md.seq_lens,
            block_table=md.block_table_tensor,
            slot_mapping=md.slot_mapping,
            scheduler_metadata=None,
            causal=True,
        )


class ZeroMismatchAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, *args, **kwargs):
        raise RuntimeError(
            "the zeromismatch vLLM plugin's attention layers only hold the KV cache; the wrapper "
            "model runs the project's attention itself (integrations/vllm/attention.py)"
        )

    def do_kv_cache_update(self, *args, **kwargs):
        raise RuntimeError("the zeromismatch vLLM plugin writes its KV cache in the project's attention")


class ZeroMismatchAttentionBackend(CPUAttentionBackend):
    # (get_name stays "CPU_ATTN": vLLM maps the name to its backend enum, and the layout and dtypes
    # the CPU backend declares are the ones this cache uses)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        # the CPU kernel wants multiples of 32; the project's paged attention takes any block size,
        # so the RL loop's kv_block_size (16 by default) is the block size on both engines
        from vllm.v1.attention.backend import MultipleOf

        return [MultipleOf(1)]

    @staticmethod
    def get_impl_cls():
        return ZeroMismatchAttentionImpl

    @staticmethod
    def get_builder_cls():
        return ZeroMismatchAttentionMetadataBuilder


def project_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The project's ``(k_cache, v_cache)`` views ``[2 * num_blocks - 1, block_size, Hkv, D]`` of one
    layer's vLLM cache ``[num_blocks, Hkv, block_size, 2 * D]`` (module docstring)."""
    if kv_cache.dim() != 4:
        raise ValueError(f"expected a [blocks, Hkv, block_size, 2 * D] KV cache, got {tuple(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        # another layout would interleave blocks of different layers or heads; the views below
        # would then alias memory vLLM hands to something else
        raise ValueError(
            "the zeromismatch plugin needs a contiguous per-layer KV cache (layout LBHNC, the CPU "
            f"backend's); got strides {kv_cache.stride()}"
        )
    num_blocks, heads, block_size, width = kv_cache.shape
    pages = kv_cache.view(2 * num_blocks, block_size, heads, width // 2)
    return pages[:-1], pages[1:]


def project_block_table(block_table: torch.Tensor) -> torch.Tensor:
    """vLLM block ids -> project block ids of the K view (the V view uses the same ids)."""
    return block_table.to(torch.int64) * 2


def project_slot_mapping(slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """vLLM slots ``b * N + o`` -> ``2b * N + o``."""
    slots = slot_mapping.to(torch.int64)
    return slots + torch.div(slots, block_size, rounding_mode="floor") * block_size
