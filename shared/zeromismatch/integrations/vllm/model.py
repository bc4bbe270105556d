"""The model classes vLLM builds for the plugin architectures: the project's ``CausalLM`` inside.

vLLM constructs ``cls(vllm_config=..., prefix=...)``, calls ``load_weights`` with the checkpoint's
tensors, then per step ``forward(input_ids, positions)`` under a forward context that carries the
attention metadata, and ``compute_logits`` on the rows it samples. The wrapper

* builds the project model from the checkpoint's own ``config.json`` (the project's parser, not
  transformers' config object, so the model is the one the trainer builds from the same file);
* registers one vLLM ``Attention`` layer per project attention layer, with the plugin's backend,
  so vLLM allocates, binds and block-manages a paged KV cache for it (``attention.py``), and
  for a hybrid one ``MambaState`` per Mamba2 layer, so vLLM gives each request a state block
  (``mamba.py``);
* turns each step's metadata into the project's engine-mode ``ForwardBatch`` (packed tokens,
  positions, ``cu_seqlens_q``, ``kv_lens``, block table, slot mapping, state slots) and a
  ``ModelCache`` whose K/V and conv/SSM state tensors are views of vLLM's cache tensors, and runs
  the project's forward, i.e. the code path of the project's own engine (chunked prefill, decode
  and mixed steps alike);
* projects logits with the project's fp32 ``compute_logits``;
* installs the project's sampler in this process (``sampler.py``) and tells it each row's
  sequence length (its per-request stream index).

Nothing of vLLM's model code runs; the classes differ only in the family they accept (and the
hybrid's in the state sizes vLLM asks its class for before building it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from ...engine.runner import batch_from_values
from ...engine.step_graphs import DecodeGraphs
from ...kernels import get_kernels
from ...models import build_model
from ...models.batch import ForwardBatch, ModelCache
from ...models.config import ModelConfig
from . import KERNEL_SETS
from . import sampler as plugin_sampler
from .attention import (
    ZeroMismatchAttentionBackend,
    project_block_table,
    project_cache_views,
    project_slot_mapping,
)
from .checkpoint import KERNELS_KEY

DEFAULT_KERNELS = "aligned"  # a checkpoint whose config.json names no kernel set (KERNELS_KEY)


def _checkpoint_config(vllm_config) -> tuple[ModelConfig, str]:
    """The checkpoint's model config and the kernel set it asks for."""
    model_path = Path(vllm_config.model_config.model)
    if not (model_path / "config.json").is_file():
        raise ValueError(
            f"the zeromismatch vLLM plugin loads local checkpoint directories; {model_path} has no "
            "config.json (write one with zeromismatch.integrations.vllm.write_checkpoint)"
        )
    raw = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    kernels = raw.get(KERNELS_KEY, DEFAULT_KERNELS)
    if kernels not in KERNEL_SETS:
        raise ValueError(
            f"{model_path / 'config.json'}: {KERNELS_KEY} {kernels!r}: the plugin runs "
            f"{', '.join(KERNEL_SETS)}"
        )
    return ModelConfig.from_hf_config(model_path / "config.json"), kernels


class _ZeroMismatchForCausalLM(nn.Module):
    family: str = ""
    zeromismatch_plugin = True  # (the sampler routes a step to the project's sampler by this)

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from vllm.model_executor.layers.attention import Attention

        config, kernel_set = _checkpoint_config(vllm_config)
        if config.family != self.family:
            raise ValueError(
                f"{type(self).__name__} runs {self.family!r} checkpoints, got a {config.family!r} one"
            )
        if getattr(vllm_config.model_config, "use_mla", False):
            # vLLM would size an MLA latent cache (one KV head of kv_lora_rank + rope dims, block size
            # 16, chunked prefill and prefix caching off on CPU); the project's DeepSeek layers cache
            # the decompressed per-head K/V instead (models/mla.py), a plain attention cache
            raise ValueError(
                "the zeromismatch plugin's DeepSeek-V3 model caches per-head K/V, not MLA's latent: "
                "start vLLM with VLLM_MLA_DISABLE=1 in the environment"
            )
        if vllm_config.cache_config.cache_dtype != "auto":
            # the project's attention writes activation-dtype K/V into the views of the cache
            raise NotImplementedError("the zeromismatch vLLM plugin runs kv_cache_dtype='auto' only")
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise NotImplementedError("the zeromismatch vLLM plugin runs at tensor-parallel size 1")
        kernels = get_kernels(kernel_set)
        dtype = vllm_config.model_config.dtype
        self.config = config
        self.model = build_model(config, kernels=kernels, dtype=dtype, seed=None)
        attn, self.attn_layer_of = [], []  # the vLLM layer of each project decoder layer (or None)
        for index, layer in enumerate(self.model.decoder_layers):
            spec = layer.kv_cache_spec()
            if spec is None:
                self.attn_layer_of.append(None)
                continue
            heads, head_dim, head_dim_v = spec
            if head_dim != head_dim_v:
                raise NotImplementedError(
                    f"layer {index}: K and V head sizes differ ({head_dim}, {head_dim_v})"
                )
            self.attn_layer_of.append(len(attn))
            attn.append(
                Attention(
                    num_heads=config.num_attention_heads,
                    head_size=head_dim,
                    scale=1.0,  # (unused: the project's attention applies its own scale)
                    num_kv_heads=heads,
                    cache_config=vllm_config.cache_config,
                    prefix=f"{prefix + '.' if prefix else ''}vllm_attn.{len(attn)}",
                    attn_backend=ZeroMismatchAttentionBackend,
                )
            )
        self.vllm_attn = nn.ModuleList(attn)
        self.vllm_mamba, self.mamba_layer_of = self._mamba_state_layers(vllm_config, prefix)
        # vLLM's switch for its own graphs (CUDA graphs, torch.compile): with enforce_eager every step
        # runs eagerly; without, pure-decode steps replay the project engine's step graphs, which give
        # the eager forward's bits (engine/step_graphs.py)
        self.graphs = DecodeGraphs(
            not vllm_config.model_config.enforce_eager, None, self.model, recurrent=bool(self.vllm_mamba)
        )
        plugin_sampler.install(kernels)

    def _mamba_state_layers(self, vllm_config, prefix: str):
        """One ``mamba.MambaState`` per Mamba2 layer (none for the other families), and the index
        of each decoder layer's among them (or None)."""
        layers, index_of = [], []
        for layer in self.model.decoder_layers:
            spec = layer.state_cache_spec()
            if spec is None:
                index_of.append(None)
                continue
            from .mamba import MambaState

            conv_shape, ssm_shape = spec
            name = f"{prefix + '.' if prefix else ''}vllm_mamba.{len(layers)}"
            index_of.append(len(layers))
            layers.append(MambaState(conv_shape, ssm_shape, self.model.dtype, name))
        return nn.ModuleList(layers), index_of

    # ---- vLLM's model interface ------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embedding(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError("the zeromismatch vLLM plugin takes token ids (no embeds, no PP)")
        metadata = self._step_metadata()
        total = input_ids.shape[0]
        if metadata is None:  # vLLM's profiling / warm-up runs: no cache, nothing is read back
            plugin_sampler.STATE.seq_lens = None
            return torch.zeros(total, self.config.hidden_size, dtype=self.model.dtype)
        batch, cache = self._engine_batch(input_ids, positions, metadata)
        plugin_sampler.STATE.seq_lens = batch.kv_lens.tolist()
        hidden = self._replayed(batch, cache)
        if hidden is None:
            hidden = self.model(batch, cache)
        if hidden.shape[0] < total:  # padded tokens (none on CPU today): rows vLLM never samples
            pad = hidden.new_zeros(total - hidden.shape[0], hidden.shape[1])
            hidden = torch.cat([hidden, pad])
        return hidden

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden_states)

    def load_weights(self, weights) -> set[str]:
        tensors = dict(weights)
        self.model.load_state_dict_hf(tensors, source="vLLM checkpoint")
        # load_state_dict_hf checks every tensor of the model was given (and no other), so every
        # parameter is loaded; the attention layers' KV scales keep vLLM's defaults (auto cache)
        return {name for name, _ in self.named_parameters()}

    def _replayed(self, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor | None:
        """A pure-decode step's hidden states from its step graph (None: run it eagerly). The graph's
        inputs are the batch's int64 fields and the Mamba layers' state slots; it is keyed on the
        batch size (vLLM's block table has one width for the whole run)."""
        seqs = batch.num_seqs
        if not self.graphs.enabled or batch.input_ids.shape[0] != seqs:
            return None  # (prefill and chunked prefill run eagerly, as on the project engine)
        table, slot_mapping = batch.block_table, batch.slot_mapping
        assert table is not None and slot_mapping is not None  # (engine mode: _engine_batch sets both)
        width = table.shape[1]
        layer_slots = [s for s in cache.state_slots or [] if s is not None]
        # the project engine's layout of a step's int64 fields (engine/runner.py::batch_from_values),
        # then each Mamba layer's state slots
        batch_slots = layer_slots[0] if layer_slots else torch.zeros(seqs, dtype=torch.int64)
        fields = [batch.input_ids, batch.positions, slot_mapping, batch.cu_seqlens_q, batch.kv_lens]
        values = torch.cat([*fields, batch_slots, table.reshape(-1), *layer_slots])
        state = cache.k_cache + cache.v_cache + cache.conv_state + cache.ssm_state
        of, head = self.mamba_layer_of, values.numel() - seqs * len(layer_slots)

        def forward(base: torch.Tensor) -> torch.Tensor:
            step_batch = batch_from_values(base[:head], (seqs, seqs, width))
            slots = base[head:].split(seqs) if layer_slots else ()
            per_layer = [None if i is None else slots[i] for i in of] if slots else None
            return self.model(step_batch, dataclasses.replace(cache, state_slots=per_layer))

        layout = (seqs, width, len(layer_slots))
        return self.graphs.forward_values(
            self.model, [t for t in state if t is not None], values, layout, forward
        )

    # ---- vLLM metadata -> project batch ----------------------------------------------------
    def _step_metadata(self):
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not self.vllm_attn or not is_forward_context_available():
            return None
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):  # (micro-batching; never on CPU)
            metadata = metadata[0]
        if not metadata:
            return None
        first = metadata[self.vllm_attn[0].layer_name]
        for layer in self.vllm_attn[1:]:
            other = metadata[layer.layer_name]
            if other is not first and not torch.equal(other.block_table, first.block_table):
                # one project block table serves every attention layer
                raise NotImplementedError(
                    "the zeromismatch vLLM plugin needs every attention layer in one KV-cache group"
                )
        self._mamba_metadata = [metadata[layer.layer_name] for layer in self.vllm_mamba]
        return first

    def _engine_batch(self, input_ids, positions, md) -> tuple[ForwardBatch, ModelCache]:
        num_tokens = int(md.num_actual_tokens)
        num_seqs = int(md.seq_lens.shape[0])
        states = [layer.kv_cache for layer in self.vllm_mamba]
        slots = [state_md.state_slots for state_md in self._mamba_metadata]
        cu = md.query_start_loc[: num_seqs + 1].to(torch.int64)
        caches = [project_cache_views(layer.kv_cache) for layer in self.vllm_attn]
        block_size = caches[0][0].shape[1]
        k_cache = [None if i is None else caches[i][0] for i in self.attn_layer_of]
        v_cache = [None if i is None else caches[i][1] for i in self.attn_layer_of]
        batch = ForwardBatch(
            input_ids=input_ids[:num_tokens].to(torch.int64),
            positions=positions[:num_tokens].to(torch.int64),
            cu_seqlens_q=cu,
            kv_lens=md.seq_lens[:num_seqs].to(torch.int64),
            block_table=project_block_table(md.block_table[:num_seqs]),
            slot_mapping=project_slot_mapping(md.slot_mapping[:num_tokens], block_size),
            state_slots=slots[0] if slots else None,
        )
        # (has_initial_state: the project's default, computed tokens > 0, is what vLLM's builder says)
        of = self.mamba_layer_of
        cache = ModelCache(
            block_size=block_size,
            num_blocks=caches[0][0].shape[0],
            k_cache=k_cache,
            v_cache=v_cache,
            conv_state=[None if i is None else states[i][0] for i in of],
            ssm_state=[None if i is None else states[i][1] for i in of],
            state_slots=[None if i is None else slots[i] for i in of] if slots else None,
            k_scale=[None] * len(k_cache),
            v_scale=[None] * len(k_cache),
        )
        return batch, cache


class ZeroMismatchQwen3ForCausalLM(_ZeroMismatchForCausalLM):
    family = "qwen3"


class ZeroMismatchQwen3MoeForCausalLM(_ZeroMismatchForCausalLM):
    family = "qwen3_moe"


class ZeroMismatchDeepseekV3ForCausalLM(_ZeroMismatchForCausalLM):
    family = "deepseek_v3"


class ZeroMismatchNemotronHForCausalLM(_ZeroMismatchForCausalLM):
    """The hybrid: its Mamba2 layers' state in vLLM's Mamba cache (``mamba.py``). vLLM reads the
    class attributes and methods below before it builds the model, to size the state pages and
    align the attention block size with them."""

    family = "nemotron_h"
    is_hybrid = True
    has_inner_state = True

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        from .mamba import hybrid_state_shapes

        config, _ = _checkpoint_config(vllm_config)
        return hybrid_state_shapes(config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        # the project engine's: the conv window in the activation dtype, the SSM state in fp32
        return vllm_config.model_config.dtype, torch.float32

    @classmethod
    def get_mamba_state_copy_func(cls):
        # copies between blocks happen only with Mamba prefix caching (mamba_cache_mode="align"),
        # which the plugin refuses (mamba.py); vLLM asks for them whatever the mode
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.mamba2_state_copy_func()
