"""``CausalLM``: the model interface the engine and the trainer share.

``forward(batch, cache=None)`` returns final-normed hidden states ``[T, hidden]`` for the packed
tokens of ``batch``; ``compute_logits`` turns them into fp32 logits through ``kernels.lm_head``.
Without a cache (trainer mode) every sequence must be complete (``kv_lens == q_lens``) and
autograd flows; with a ``ModelCache`` (engine mode) attention layers append this step's K/V
at ``slot_mapping`` and attend over the paged cache, Mamba2 layers read and write their
per-sequence conv/SSM state at ``state_slots``.

State dict in Hugging Face names and layout (``state_dict_hf`` / ``load_state_dict_hf``): the
module tree mirrors HF's, so names map one to one except (a) routed experts, stacked here and
per expert in HF, and (b) tensor-parallel shards, gathered on save and sliced on load, so
every rank exchanges *full* HF tensors. Loading validates everything before touching a
parameter: missing, unexpected, wrongly shaped, non-floating and non-finite tensors each give
one ValueError naming the tensor.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import get_kernels
from ..kernels.base import KernelSet
from ..kernels.capture.allowed_host_reads import host_reads_for_checks
from ..kernels.quant import check_kv_cache_dtype
from .batch import ForwardBatch, ModelCache
from .config import ModelConfig
from .layers import VIRTUAL_SHARDS, ForwardContext, Linear, LMHead
from .tp import TensorParallel


@dataclass
class _Entry:
    """One HF tensor: where it lives in this model and how it is sharded."""

    name: str
    module: nn.Module
    attr: str
    expert: int | None
    tp_dim: int | None
    full_shape: tuple[int, ...]


#: config fields a tensor-parallel degree must divide (the sharded head and width dimensions)
TP_SHARDED_FIELDS = (
    "num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
    "mamba_num_heads",
)  # fmt: skip


def check_tp_degree(config, degree: int, name: str = "tensor-parallel degree") -> None:
    """Reject a TP degree the model cannot be sharded by: it must divide the virtual shards of the
    row-parallel linears and every sharded dimension (callers that spawn workers check it first)."""
    if degree < 1:
        raise ValueError(f"{name} must be >= 1, got {degree}")
    if VIRTUAL_SHARDS % degree:
        raise ValueError(
            f"{name} {degree} must divide the {VIRTUAL_SHARDS} virtual shards of the row-parallel linears"
        )
    for field in TP_SHARDED_FIELDS:
        size = int(getattr(config, field, 0) or 0)
        if size % degree:
            raise ValueError(f"{name} {degree} must divide the model's {field}={size}")


def check_hf_names(state_dict, expected: dict, ignorable: Callable[[str], bool], source: str, what: str):
    """Every expected HF name present and no other (bar ``ignorable`` ones): else one ValueError naming
    the first offender and how many more there are; ``what`` names the model in the message."""
    missing = [name for name in expected if name not in state_dict]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{source}: missing tensor {missing[0]!r}{more}")
    unexpected = sorted(n for n in state_dict if n not in expected and not ignorable(n))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ValueError(f"{source}: unexpected tensor {unexpected[0]!r}{more} for {what}")


def check_hf_tensors(state_dict, expected: dict[str, tuple[int, ...]], source: str, expects: str) -> None:
    """Each expected tensor a finite floating torch.Tensor of its shape, else one error naming it;
    ``expects`` words the shape message (", expected", "; the Megatron qwen3 spec expects")."""
    for name, shape in expected.items():
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{source}: tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}{expects} {shape}")
        if not tensor.is_floating_point():
            raise ValueError(f"{source}: tensor {name!r} has dtype {tensor.dtype}, expected a floating dtype")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source}: tensor {name!r} contains NaN or Inf values")


class CausalLM(nn.Module):
    family: str = ""
    #: False for models whose per-sequence state cannot be rebuilt from cached K/V (Mamba2)
    supports_prefix_caching: bool = True

    def __init__(self, config: ModelConfig, kernels: str | KernelSet = "aligned", tp_group=None):
        super().__init__()
        if config.family != self.family:
            raise ValueError(f"{type(self).__name__} needs a {self.family!r} config, got {config.family!r}")
        self.config = config
        self.tp = TensorParallel.from_group(tp_group)
        check_tp_degree(config, self.tp.world_size)
        self._kernels = get_kernels(kernels)
        self.build_layers()

    # ---- structure (subclasses) ------------------------------------------------
    def build_layers(self) -> None:
        raise NotImplementedError

    @property
    def embedding(self) -> nn.Module:
        raise NotImplementedError

    @property
    def decoder_layers(self) -> nn.ModuleList:
        raise NotImplementedError

    @property
    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    @property
    def ties_word_embeddings(self) -> bool:
        """Whether the LM head reuses the input embedding (as the family's transformers class
        does for ``tie_word_embeddings``; Nemotron-H overrides this: it never ties)."""
        return self.config.tie_word_embeddings

    def _attach_lm_head(self) -> None:
        if not self.ties_word_embeddings:
            self.lm_head = LMHead(self.config.vocab_size, self.config.hidden_size)

    def _ignorable(self, name: str) -> bool:
        """Checkpoint tensors we deliberately do not load (subclasses extend). A tied model's
        ``lm_head.weight`` is only ignorable once ``_validate_hf_tensors`` has checked that it
        equals the embedding."""
        if name.endswith("rotary_emb.inv_freq"):
            return True
        return self.ties_word_embeddings and name == "lm_head.weight"

    # ---- kernels ----------------------------------------------------------------
    @property
    def kernels(self) -> KernelSet:
        return self._kernels

    def set_kernels(self, name_or_set: str | KernelSet) -> None:
        self._kernels = get_kernels(name_or_set)

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.ties_word_embeddings else self.lm_head.weight

    # ---- forward ----------------------------------------------------------------
    def forward(self, batch: ForwardBatch, cache: ModelCache | None = None) -> torch.Tensor:
        with host_reads_for_checks():  # (a step graph's replay skips them: kernels/step_graph.py)
            self._check_batch(batch, cache)
        ctx = ForwardContext(self.kernels, batch, cache)
        if cache is not None and any(state is not None for state in cache.ssm_state + cache.conv_state):
            if batch.has_initial_state is not None:
                ctx.has_initial_state = batch.has_initial_state.to(torch.bool)
            else:
                ctx.has_initial_state = (batch.kv_lens - batch.q_lens) > 0
        hidden = self.embedding(batch.input_ids)
        for index, layer in enumerate(self.decoder_layers):
            ctx.layer_index = index
            hidden = layer(hidden, ctx)
        return self.final_norm(hidden, self.kernels)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[T, vocab]`` via ``kernels.lm_head``."""
        return self.kernels.lm_head(hidden, self.lm_head_weight)

    def _check_batch(self, batch: ForwardBatch, cache: ModelCache | None) -> None:
        if not isinstance(batch, ForwardBatch):
            raise TypeError(f"forward takes a ForwardBatch, got {type(batch).__name__}")
        ids = batch.input_ids
        if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"batch.input_ids must be a 1-D integer tensor, got {tuple(ids.shape)} {ids.dtype}"
            )
        tokens = ids.numel()
        if batch.positions.shape != ids.shape:
            raise ValueError(
                f"batch.positions has shape {tuple(batch.positions.shape)}, expected ({tokens},)"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"batch.input_ids has ids outside [0, {self.config.vocab_size})")
        cu = batch.cu_seqlens_q
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != tokens:
            raise ValueError(f"batch.cu_seqlens_q must run from 0 to {tokens} (got {cu.tolist()})")
        if batch.kv_lens.shape != (batch.num_seqs,):
            raise ValueError(
                f"batch.kv_lens has shape {tuple(batch.kv_lens.shape)}, expected ({batch.num_seqs},)"
            )
        if cache is None:
            if not torch.equal(batch.kv_lens.to(torch.int64), batch.q_lens.to(torch.int64)):
                raise ValueError(
                    "trainer mode (no cache) needs complete sequences (kv_lens == q_lens); "
                    "pass a ModelCache for chunked prefill or decode"
                )
            return
        if not isinstance(cache, ModelCache):
            raise TypeError(f"cache must be a ModelCache, got {type(cache).__name__}")
        if len(cache.k_cache) != len(self.decoder_layers):
            raise ValueError(f"cache has {len(cache.k_cache)} layers, model has {len(self.decoder_layers)}")
        needs_kv = any(layer.kv_cache_spec() is not None for layer in self.decoder_layers)
        needs_state = any(layer.state_cache_spec() is not None for layer in self.decoder_layers)
        if needs_kv:
            if batch.block_table is None or batch.slot_mapping is None:
                raise ValueError("engine mode needs batch.block_table and batch.slot_mapping")
            if batch.slot_mapping.shape != (tokens,):
                raise ValueError(
                    f"batch.slot_mapping has shape {tuple(batch.slot_mapping.shape)}, expected ({tokens},)"
                )
        if needs_state and (batch.state_slots is None or batch.state_slots.shape != (batch.num_seqs,)):
            raise ValueError("engine mode on a hybrid model needs batch.state_slots of shape [num_seqs]")

    # ---- engine cache -----------------------------------------------------------
    def allocate_cache(
        self,
        num_blocks: int,
        block_size: int,
        max_seqs: int,
        dtype: torch.dtype | None = None,
        kv_cache_dtype: str = "auto",
    ) -> ModelCache:
        """Zeroed paged K/V for attention layers and conv/SSM state slots for Mamba2 layers.
        SSM state is always fp32 (``mamba_ssm_cache_dtype``); everything else is ``dtype``.

        ``kv_cache_dtype="fp8_e4m3"`` (bf16/fp16 models only) rounds every cached K/V through e4m3
        (``ModelCache``). Scales follow vLLM's default for a checkpoint without calibrated KV
        scales: ``k_scale = v_scale = 1.0`` for every attention layer, constant for the engine's
        life, so a weight update cannot leave them stale. vLLM's ``calculate_kv_scales`` (scales
        computed once from the first batch's amax and never again, stale after a refit: a known
        production bug in RL) is not modelled: it makes the scales depend on which batch came
        first, and the unit rule is what a stock vLLM deployment without that flag runs. On DeepSeek
        MLA the rounded values are the decompressed per-head K/V this cache holds, not vLLM's latent
        ``[c_kv, k_rope]`` (models/mla.py), so the rounding point differs from vLLM's there."""
        for what, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_seqs", max_seqs)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"allocate_cache: {what} must be a positive int, got {value!r}")
        check_kv_cache_dtype(kv_cache_dtype, self.dtype)
        dtype = dtype or self.dtype
        device = self.embedding.weight.device
        cache = ModelCache(block_size=block_size, num_blocks=num_blocks, kv_cache_dtype=kv_cache_dtype)
        for layer in self.decoder_layers:
            kv, state = layer.kv_cache_spec(), layer.state_cache_spec()
            if kv is not None:
                heads, dqk, dv = kv
                cache.k_cache.append(
                    torch.zeros(num_blocks, block_size, heads, dqk, dtype=dtype, device=device)
                )
                cache.v_cache.append(
                    torch.zeros(num_blocks, block_size, heads, dv, dtype=dtype, device=device)
                )
            else:
                cache.k_cache.append(None)
                cache.v_cache.append(None)
            fp8_layer = cache.fp8 and kv is not None
            for scales in (cache.k_scale, cache.v_scale):
                scales.append(torch.ones((), dtype=torch.float32, device=device) if fp8_layer else None)
            if state is not None:
                conv_shape, ssm_shape = state
                cache.conv_state.append(torch.zeros(max_seqs, *conv_shape, dtype=dtype, device=device))
                cache.ssm_state.append(torch.zeros(max_seqs, *ssm_shape, dtype=torch.float32, device=device))
            else:
                cache.conv_state.append(None)
                cache.ssm_state.append(None)
        return cache

    # ---- Hugging Face state dict --------------------------------------------------
    def _hf_entries(self) -> Iterator[_Entry]:
        from .moe import Experts

        world = self.tp.world_size
        for module_name, module in self.named_modules():
            prefix = f"{module_name}." if module_name else ""
            if isinstance(module, Experts):
                for proj in module.projection_names():
                    for e in range(module.num_experts):
                        if module.quantized is not None:
                            shape = tuple(module.quantized[proj][e].shape)
                        else:
                            shape = tuple(getattr(module, proj).shape[1:])
                        yield _Entry(f"{prefix}{e}.{proj}.weight", module, proj, e, None, shape)
                continue
            tp_dims = getattr(module, "tp_dims", {})
            names = [n for n, p in module._parameters.items() if p is not None]
            names += [
                n
                for n, b in module._buffers.items()
                if b is not None and n not in module._non_persistent_buffers_set
            ]
            if isinstance(module, Linear) and module.weight is None:
                names.insert(0, "weight")
            for attr in names:
                tensor = getattr(module, attr)
                if tensor is None:  # a quantized Linear's weight
                    shape = list(module.qweight.shape)
                else:
                    shape = list(tensor.shape)
                tp_dim = tp_dims.get(attr)
                if tp_dim is not None and world > 1:
                    shape[tp_dim] *= world
                yield _Entry(f"{prefix}{attr}", module, attr, None, tp_dim, tuple(shape))

    def hf_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded) shape of every tensor of the HF checkpoint, by HF name."""
        return {entry.name: entry.full_shape for entry in self._hf_entries()}

    def state_dict_hf(self) -> dict[str, torch.Tensor]:
        """Full HF-named tensors (gathered over TP ranks; a collective when TP > 1)."""
        out: dict[str, torch.Tensor] = {}
        for entry in self._hf_entries():
            tensor = getattr(entry.module, entry.attr)
            if tensor is None or (entry.expert is not None and entry.module.quantized is not None):
                raise ValueError(
                    f"{entry.name}: the model is quantized; state_dict_hf only exports dense weights "
                    "(keep the unquantized model for saving)"
                )
            tensor = tensor.detach()
            if entry.expert is not None:
                tensor = tensor[entry.expert]
            if entry.tp_dim is not None:
                tensor = self.tp.gather(tensor, entry.tp_dim)
            out[entry.name] = tensor.clone().contiguous()
        return out

    def load_state_dict_hf(self, state_dict: dict[str, torch.Tensor], source: str = "state dict") -> None:
        """Copy full HF-named tensors in (sliced to this TP rank); quantized layers re-quantize."""
        entries = list(self._hf_entries())
        self._validate_hf_tensors(state_dict, entries, source)
        with torch.no_grad():
            for entry in entries:
                src = state_dict[entry.name]
                if entry.tp_dim is not None:
                    src = self.tp.shard(src, entry.tp_dim, entry.name)
                module = entry.module
                # a quantized layer quantizes the weight as this model holds it: cast to the model's dtype
                # first, as an engine loading bf16 weights into an FP8/NVFP4 model does
                if entry.expert is not None and module.quantized is not None:
                    module.quantized[entry.attr][entry.expert] = module.requantize(src.to(self.dtype))
                elif isinstance(module, Linear) and module.qweight is not None and entry.attr == "weight":
                    module.qweight = module.requantize(src.to(self.dtype))
                elif entry.expert is not None:
                    getattr(module, entry.attr)[entry.expert].copy_(src)
                else:
                    getattr(module, entry.attr).copy_(src)

    def _validate_hf_tensors(self, state_dict, entries: list[_Entry], source: str) -> None:
        expected = {entry.name: entry.full_shape for entry in entries}
        check_hf_names(state_dict, expected, self._ignorable, source, f"a {self.family} model")
        self._check_tied_head(state_dict, entries, source)
        check_hf_tensors(state_dict, expected, source, ", expected")

    def _check_tied_head(self, state_dict, entries: list[_Entry], source: str) -> None:
        """A tied model has no head of its own: a checkpoint ``lm_head.weight`` that is not the
        embedding would be silently replaced by it, so it is an error rather than ignored."""
        head = state_dict.get("lm_head.weight")
        if not self.ties_word_embeddings or head is None:
            return
        embedding = self.embedding
        name = next(e.name for e in entries if e.module is embedding and e.attr == "weight")
        same = (
            isinstance(head, torch.Tensor)
            and head.shape == state_dict[name].shape
            and head.dtype == state_dict[name].dtype
            and torch.equal(head, state_dict[name])
        )
        if not same:
            raise ValueError(
                f"{source}: tie_word_embeddings is true but tensor 'lm_head.weight' differs from "
                f"{name!r}; the model would use the embedding and drop this head"
            )

    # ---- random init ----------------------------------------------------------------
    def init_random(self, seed: int = 0) -> None:
        """Deterministic random weights: each HF tensor drawn from its own generator seeded by
        (seed, name), so the result does not depend on TP degree or module order."""
        self.load_state_dict_hf(
            random_hf_state_dict(self.config, self.hf_tensor_shapes(), seed), "random init"
        )


def random_hf_state_dict(config: ModelConfig, shapes: dict[str, tuple[int, ...]], seed: int):
    """transformers-like init: normal(0, initializer_range) matrices, unit norms, zero biases,
    Mamba2 ``A_log = log(1..H)``, ``D = 1``, ``dt_bias`` = softplus^-1 of dt log-uniform in
    [1e-3, 1e-1] (transformers' defaults)."""
    out = {}
    std = config.initializer_range
    for name, shape in sorted(shapes.items()):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            tensor = torch.log(torch.arange(1, shape[0] + 1, dtype=torch.float32))
        elif leaf == "D":
            tensor = torch.ones(shape)
        elif leaf == "dt_bias":
            lo, hi = math.log(1e-3), math.log(1e-1)
            dt = torch.exp(torch.rand(shape, generator=gen) * (hi - lo) + lo).clamp(min=1e-4)
            tensor = dt + torch.log(-torch.expm1(-dt))
        elif leaf in ("bias", "e_score_correction_bias"):
            tensor = torch.zeros(shape)
        elif "norm" in name.rsplit(".", 2)[-2] or name.endswith("norm_f.weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.randn(shape, generator=gen) * std
        out[name] = tensor
    return out
