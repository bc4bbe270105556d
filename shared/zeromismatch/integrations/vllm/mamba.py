"""The plugin's Mamba2 state: vLLM allocates and assigns a state block per request, the project's
kernels read and update it.

A hybrid checkpoint's wrapper model registers one ``MambaState`` per Mamba2 layer of the project
model, only so that vLLM sizes, allocates and binds that layer's recurrent state and gives every
request a block of it (vLLM finds state layers through ``MambaBase`` modules in the forward
context, as it finds KV-cache layers through ``Attention``). As with attention
(``attention.py``), nothing of vLLM's Mamba kernels runs: the project's ``Mamba2Mixer``
(``models/hybrid.py``) calls the KernelSet's ``causal_conv1d`` and ``ssm_scan`` on views of the
bound state, the code path of the project's own engine, so the bits are the engine's.

State layout. The states are the project engine's (``CausalLM.allocate_cache``): the conv window
``[C, W - 1]`` in the activation dtype and the SSM state ``[H, P, N]`` in fp32; only this plugin
reads or writes them, so vLLM's own Mamba2 layout (``[W - 1, C]``, its ``mamba_ssm_cache_dtype``)
need not be followed. ``MambaBase.bind_kv_cache`` cuts both out of each block's page, so a layer's
``kv_cache`` is ``(conv [blocks, C, W - 1], ssm [blocks, H, P, N])``, strided by the page: the
kernels gather the batch's rows and scatter them back (``kernels/aligned/ssm.py::through_slots``).

Metadata. The builder keeps what the project's forward needs: each request's state block
(column 0 of its group's block table, ``mamba_cache_mode="none"``) and whether that block holds
a state to continue from (tokens already computed: a later prefill chunk or a decode). vLLM's
hybrid allocator puts Mamba layers in several KV-cache groups (each as large as the smallest
layer type), so each layer reads its own group's blocks (``ModelCache.state_slots``). The builder
asks for no batch reordering (vLLM's Mamba2 builder puts decodes first for its kernels; the
project's kernels take any order).

Prefix caching stays off for hybrids, as on the project's engine (``supports_prefix_caching``):
a state summarises its whole prefix and cannot be re-derived from cached blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionBackend
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum


@dataclass
class MambaStateMetadata:
    num_actual_tokens: int
    state_slots: torch.Tensor  # [num_reqs] int64: each request's state block in this layer's group
    has_initial_state: torch.Tensor  # [num_reqs] bool: the block holds a state to continue from


class MambaStateMetadataBuilder(AttentionMetadataBuilder[MambaStateMetadata]):
    _cudagraph_support = AttentionCGSupport.NEVER
    reorder_batch_threshold = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.vllm_config = vllm_config

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        md = common_attn_metadata
        if self.vllm_config.cache_config.mamba_cache_mode != "none":
            raise NotImplementedError(
                "the zeromismatch vLLM plugin keeps one Mamba state block per request "
                f"(mamba_cache_mode='none'), got {self.vllm_config.cache_config.mamba_cache_mode!r}: "
                "start vLLM with enable_prefix_caching=False for a hybrid model"
            )
        reqs = md.num_reqs
        return MambaStateMetadata(
            num_actual_tokens=md.num_actual_tokens,
            state_slots=md.block_table_tensor[:reqs, 0].to(torch.int64),
            has_initial_state=md.compute_num_computed_tokens()[:reqs] > 0,
        )


class MambaStateBackend(Mamba2AttentionBackend):
    # (get_name stays "MAMBA2_ATTN": vLLM maps the name to its backend enum)

    @staticmethod
    def get_builder_cls():
        return MambaStateMetadataBuilder


class MambaState(MambaBase, nn.Module):
    """Holds one Mamba2 layer's recurrent state for vLLM; never called (module docstring)."""

    def __init__(self, conv_shape, ssm_shape, conv_dtype: torch.dtype, prefix: str):
        nn.Module.__init__(self)
        self.conv_shape, self.ssm_shape = tuple(conv_shape), tuple(ssm_shape)
        self.conv_dtype = conv_dtype
        self.prefix = prefix
        self.layer_name = prefix
        self.kv_cache = (torch.tensor([]), torch.tensor([]))
        context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        context[prefix] = self

    def get_state_shape(self):
        return self.conv_shape, self.ssm_shape

    def get_state_dtype(self):
        return self.conv_dtype, torch.float32

    @property
    def mamba_type(self):
        return MambaAttentionBackendEnum.MAMBA2

    def get_attn_backend(self):
        return MambaStateBackend

    def forward(self, *args, **kwargs):
        raise RuntimeError(
            "the zeromismatch vLLM plugin's Mamba state layers only hold the state; the wrapper model "
            "runs the project's Mamba2 mixer itself (integrations/vllm/mamba.py)"
        )


def hybrid_state_shapes(config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(conv, ssm)`` state shapes of one Mamba2 layer of ``config`` (a project ``ModelConfig``),
    as ``Mamba2Mixer.state_cache_spec`` gives them."""
    return (config.mamba_conv_dim, config.conv_kernel - 1), (
        config.mamba_num_heads,
        config.mamba_head_dim,
        config.ssm_state_size,
    )
