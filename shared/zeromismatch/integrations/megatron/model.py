"""``MegatronCausalLM``: a Megatron-core ``GPTModel`` behind the interface of the project's ``CausalLM``.

The ``GPTModel`` (``self.gpt``; for Nemotron-H a ``MambaModel`` on Megatron's hybrid stack,
``hybrid.py``, with the same embedding / decoder / output-layer interface) is built from the layer
specs of ``specs.py``, so every op of its
forward is a KernelSet op, and its output layer is ``KernelOutputLayer`` (fp32 ``lm_head``). Around
it, the trainer-side interface the project's code uses on a ``CausalLM``:

- ``forward(batch)`` -> final-normed hidden states ``[T, hidden]`` of a trainer-mode
  ``ForwardBatch``, run as Megatron's packed ``thd`` format (``PackedSeqParams``) through the
  GPTModel's own embedding and decoder; ``compute_logits(hidden)`` -> fp32 logits through its
  output layer (gathered over the vocabulary). So ``train.logprobs.compute_logprobs`` runs on it
  unchanged, micro-batching and row selection included. ``padded_logits`` runs the whole
  ``GPTModel.forward`` on a right-padded ``sbhd`` batch.
- ``state_dict_hf`` / ``load_state_dict_hf`` / ``hf_tensor_shapes`` in HF names and full shapes
  (``weights.py``; gathered over the TP group on save, sliced on load, validated before any copy),
  so checkpoints, weight hashes, engine updates and resume see the same tensors as from a
  ``CausalLM``.
- ``parameters()``: Megatron's own parameters (this rank's shards), for any torch optimizer.
- ``kernels`` / ``set_kernels``: one KernelSlot shared by every module.
- ``fake_quant_format``: the weight format of a fake-quantized learner (``quantized.py``: the
  project learner's ``FakeQuantizer`` per HF tensor, straight-through gradient), else None.

Engine mode (a ``ModelCache``) is not offered: the rollout side stays the project's engine.
"""

from __future__ import annotations

import contextlib
import logging
import math

import torch
from torch import nn

from ...kernels.base import KernelSet
from ...models.batch import ForwardBatch
from ...models.causal_lm import check_hf_names, check_hf_tensors
from ...models.config import ModelConfig
from .config import check_megatron_model, transformer_config
from .runtime import ensure_parallel_state, import_megatron

_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def _is_mtp(config: ModelConfig, name: str) -> bool:
    """A multi-token-prediction tensor, skipped on load as the project's models skip it (DeepSeek-V3:
    ``model.layers.{i}`` past ``num_hidden_layers``; Nemotron-H: ``mtp.``)."""
    if name.startswith("mtp."):
        return True
    parts = name.split(".")
    return (config.family == "deepseek_v3" and parts[:2] == ["model", "layers"] and len(parts) > 2
            and parts[2].isdigit() and int(parts[2]) >= config.num_hidden_layers)  # fmt: skip


@contextlib.contextmanager
def _quiet_megatron_build():
    """Megatron logs a warning for every layer whose MLP class it does not know (ours); the
    subclass takes the default TP group, as intended, so the notice is dropped while building."""
    logger = logging.getLogger("megatron.core.transformer.transformer_layer")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _kernel_gpt_class():
    """``GPTModel`` with its output layer on the KernelSet (GPTModel builds a stock
    ``ColumnParallelLinear`` itself, outside any spec; it is replaced, same shape and sharding)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    from .layers import KernelOutputLayer

    class KernelGPTModel(GPTModel):
        def __init__(self, config, transformer_layer_spec, *, kernel_slot, **kwargs):
            super().__init__(config, transformer_layer_spec, **kwargs)
            if self.post_process:
                tied = self.pre_process and self.share_embeddings_and_output_weights
                self.output_layer = KernelOutputLayer.for_model(self, kernel_slot, tied=tied)

    return KernelGPTModel


class MegatronCausalLM(nn.Module):
    """A Megatron ``GPTModel`` on the KernelSet; see the module docstring.

    ``stock_spec=True`` builds Megatron's own local spec on the same parameter names instead (torch
    ops, Megatron's RoPE and attention): the comparison that shows what the kernel specs change, not a
    learner. On a CPU its RoPE, default mask and dropout RNG fork need CUDA; the tests shim them
    (tests/megatron/megatron_helpers.py)."""

    def __init__(
        self,
        config: ModelConfig,
        kernels: str | KernelSet = "aligned",
        dtype: torch.dtype = torch.float32,
        tp_size: int = 1,
        stock_spec: bool = False,
    ):
        super().__init__()
        check_megatron_model(config, tp_size)
        if stock_spec and config.family != "qwen3":
            raise ValueError(
                f"stock_spec=True (Megatron's local spec) is built for qwen3 only, got {config.family!r}"
            )
        import_megatron()
        ensure_parallel_state(tp_size)
        from .layers import KernelSlot
        from .runtime import tp_rank_and_size
        from .weights import family_maps

        self.config = config
        self.family = config.family
        # Nemotron-H never ties its LM head (transformers' NemotronHForCausalLM keeps its own)
        self.tied = config.tie_word_embeddings and config.family != "nemotron_h"
        self._init_args = (config, dtype, tp_size, stock_spec)
        self._slot = KernelSlot(kernels)
        self.tp_rank, self.tp_size = tp_rank_and_size()
        mcfg = transformer_config(config, dtype, tp_size)
        with _quiet_megatron_build():
            self.gpt = self._build_gpt(mcfg, config, stock_spec)
        self.maps = family_maps(config)
        self.fake_quant_format: str | None = None  # set by quantized.fake_quantize_megatron
        names = set(self._params())
        mapped = {m.megatron for m in self.maps}
        if names != mapped:  # a spec and its weight map out of step is a bug here, not bad input
            raise RuntimeError(f"Megatron weight map mismatch: unmapped {sorted(names - mapped)}, "
                               f"missing {sorted(mapped - names)}")  # fmt: skip

    def _build_gpt(self, mcfg, config: ModelConfig, stock_spec: bool):
        from .specs import block_spec, stock_local_block_spec

        common = dict(
            vocab_size=config.vocab_size, max_sequence_length=config.max_position_embeddings,
            parallel_output=False, share_embeddings_and_output_weights=self.tied,
        )  # fmt: skip
        if config.family == "nemotron_h":  # Megatron's hybrid stack (hybrid.py)
            from .hybrid import kernel_mamba_model_class
            from .specs import nemotron_h_stack_spec

            return kernel_mamba_model_class()(
                mcfg, nemotron_h_stack_spec(config, self._slot), hybrid_override_pattern=config.layer_pattern,
                position_embedding_type="none", kernel_slot=self._slot, **common,
            )  # fmt: skip
        if stock_spec:  # Megatron's own numerics on the same parameters (the comparison, not the learner)
            from megatron.core.models.gpt.gpt_model import GPTModel

            return GPTModel(
                mcfg, stock_local_block_spec(config), position_embedding_type="rope",
                rotary_base=int(config.rope_theta), **common,
            )  # fmt: skip
        return _kernel_gpt_class()(
            mcfg, block_spec(config, self._slot), position_embedding_type="none", kernel_slot=self._slot,
            **common,
        )  # fmt: skip

    # ---- kernels --------------------------------------------------------------------------------
    @property
    def kernels(self) -> KernelSet:
        return self._slot.kernels

    def set_kernels(self, name_or_set: str | KernelSet) -> None:
        from ...kernels import get_kernels

        self._slot.kernels = get_kernels(name_or_set)

    @property
    def dtype(self) -> torch.dtype:
        return self.gpt.embedding.word_embeddings.weight.dtype

    @property
    def tp_group(self):
        return self.gpt.pg_collection.tp

    # ---- forward ----------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch, cache=None) -> torch.Tensor:
        """Final-normed hidden states ``[T, hidden]`` of a trainer-mode batch (packed thd)."""
        if cache is not None:
            raise ValueError("the Megatron learner has no engine mode: forward takes no cache")
        if not isinstance(batch, ForwardBatch):
            raise TypeError(f"forward takes a ForwardBatch, got {type(batch).__name__}")
        if not torch.equal(batch.kv_lens.to(torch.int64), batch.q_lens.to(torch.int64)):
            raise ValueError("the Megatron learner needs complete sequences (kv_lens == q_lens)")
        from .attention import KernelPackedSeqParams

        ids = batch.input_ids
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(f"batch.input_ids has ids outside [0, {self.config.vocab_size})")
        lens = batch.q_lens
        packed = KernelPackedSeqParams(
            qkv_format="thd", cu_seqlens_q=batch.cu_seqlens_q, cu_seqlens_kv=batch.cu_seqlens_q,
            max_seqlen_q=int(lens.max()), max_seqlen_kv=int(lens.max()), positions=batch.positions,
        )  # fmt: skip
        ids = ids[None, :]
        embedded = self.gpt.embedding(input_ids=ids, position_ids=batch.positions[None, :])
        hidden = self.gpt.decoder(hidden_states=embedded, attention_mask=None, packed_seq_params=packed)
        return hidden.squeeze(1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[T, vocab]`` through the output layer (the KernelSet's ``lm_head``)."""
        weight = self.gpt.shared_embedding_or_output_weight() if self.tied else None
        logits, _ = self.gpt.output_layer(hidden, weight=weight, runtime_gather_output=True)
        return logits

    def padded_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``GPTModel.forward`` end to end on right-padded sequences ``[b, s]`` (Megatron's sbhd
        layout, causal mask): logits ``[b, s, vocab]``, position ``[i, j]`` predicting token j + 1
        of row i (rows past a sequence's end are padding)."""
        positions = torch.arange(input_ids.shape[1], dtype=torch.int64).expand_as(input_ids)
        return self.gpt(input_ids, positions, None, runtime_gather_output=True)

    # ---- training ---------------------------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float) -> float:
        """The global L2 norm of the gradients (float64, before clipping) over the whole model, then
        every gradient scaled by ``max_norm / (norm + 1e-6)`` where that is below 1 (``max_norm`` 0:
        no clipping), as ``torch.nn.utils.clip_grad_norm_`` scales them. Over the TP group a sharded
        parameter's squares are summed across ranks and a replicated one's counted once (every rank
        holds the same gradient), so each rank gets the norm TP 1 would, up to fp32 rounding of the
        gradients themselves (tests/megatron/test_megatron_tp_training.py)."""
        from .weights import REPLICATED_KINDS

        replicated = {m.megatron for m in self.maps if m.kind in REPLICATED_KINDS}
        sharded_sq = torch.zeros((), dtype=torch.float64)
        replicated_sq = torch.zeros((), dtype=torch.float64)
        present = []
        for name, param in self.gpt.named_parameters():
            if param.grad is None:
                continue
            present.append(param)
            square = param.grad.detach().double().pow(2).sum()
            if name in replicated:
                replicated_sq += square
            else:
                sharded_sq += square
        if self.tp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(sharded_sq, group=self.tp_group)
        norm = math.sqrt(float(sharded_sq + replicated_sq))
        if max_norm > 0 and math.isfinite(norm):
            coefficient = max_norm / (norm + 1e-6)
            if coefficient < 1.0:
                for param in present:
                    param.grad.detach().mul_(coefficient)
        return norm

    # ---- HF state dict ------------------------------------------------------------------------------
    def _params(self) -> dict[str, torch.Tensor]:
        """Parameters and persistent buffers (a sigmoid router's ``e_score_correction_bias``: a
        checkpoint tensor, not trained) by Megatron name."""
        return {**dict(self.gpt.named_buffers()), **dict(self.gpt.named_parameters())}

    def hf_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        from .weights import full_shape

        params, shapes = self._params(), {}
        for m in self.maps:
            full = full_shape(m.kind, tuple(params[m.megatron].shape), self.tp_size)
            shapes.update(zip(m.hf, m.hf_shapes(full)))
        return shapes

    def state_dict_hf(self) -> dict[str, torch.Tensor]:
        """Full HF-named tensors (gathered over the TP group: a collective when TP > 1)."""
        from .weights import REPLICATED_KINDS

        params, out = self._params(), {}
        for m in self.maps:
            local = params[m.megatron].detach()
            per_rank = [local] if m.kind in REPLICATED_KINDS else self._gather(local)
            for name, tensor in zip(m.hf, m.to_hf(per_rank)):
                out[name] = tensor.clone().contiguous()
        return out

    def _gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        if self.tp_size == 1:
            return [local]
        import torch.distributed as dist

        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        dist.all_gather(parts, local.contiguous(), group=self.tp_group)
        return parts

    def load_state_dict_hf(self, state_dict: dict[str, torch.Tensor], source: str = "state dict") -> None:
        """Copy full HF-named tensors in (this rank's slices); everything is validated first, each
        problem one ValueError naming the tensor (a shape that does not fit this spec included)."""
        self._validate(state_dict, source)
        params = self._params()
        with torch.no_grad():
            for m in self.maps:
                local = m.to_megatron([state_dict[n] for n in m.hf], self.tp_rank, self.tp_size)
                params[m.megatron].copy_(local)

    def _validate(self, state_dict, source: str) -> None:
        expected = self.hf_tensor_shapes()
        spec = f"the Megatron {self.family} spec"
        check_hf_names(state_dict, expected, self._ignorable, source, spec)
        check_hf_tensors(state_dict, expected, source, f"; {spec} expects")
        head = state_dict.get("lm_head.weight")
        if self.tied and head is not None:
            embedding = state_dict["model.embed_tokens.weight"]
            if head.shape != embedding.shape or not torch.equal(head, embedding):
                raise ValueError(
                    f"{source}: tie_word_embeddings is true but tensor 'lm_head.weight' differs from "
                    "'model.embed_tokens.weight'; the model would use the embedding and drop this head"
                )

    def _ignorable(self, name: str) -> bool:
        tied_head = self.tied and name == "lm_head.weight"
        return name.endswith(_IGNORABLE_SUFFIXES) or tied_head or _is_mtp(self.config, name)

    # ---- copies ------------------------------------------------------------------------------
    def __deepcopy__(self, memo):
        """A fresh model with the same spec, kernels and weights (Megatron modules hold process
        groups, which cannot be copied). The learner's shadow model is made this way."""
        config, dtype, tp_size, stock_spec = self._init_args
        twin = MegatronCausalLM(config, self.kernels, dtype, tp_size, stock_spec)
        twin.load_state_dict_hf(self.state_dict_hf(), source="copy")
        if self.fake_quant_format is not None:
            from .quantized import fake_quantize_megatron

            fake_quantize_megatron(twin, self.fake_quant_format)
        twin.train(self.training)
        return twin


def build_megatron_model(
    config_or_preset: ModelConfig | str | dict,
    kernels: str | KernelSet = "aligned",
    dtype: torch.dtype = torch.float32,
    seed: int | None = 0,
    tp_size: int = 1,
    stock_spec: bool = False,
    quant: str | None = None,
) -> MegatronCausalLM:
    """A ``MegatronCausalLM`` for a preset / HF config, holding the weights the project's
    ``models.build_model(..., seed=seed)`` draws (the same HF tensors, so both learners and the engine
    start from the same bits); ``seed=None`` leaves them for the caller to load. ``quant`` (a format
    of ``models.QUANT_FORMATS``; None / "none": dense): a fake-quantized learner, as the project's
    ``build_trainer_model`` makes one."""
    from ...models import build_model, resolve_config
    from .quantized import check_quant, fake_quantize_megatron

    config = resolve_config(config_or_preset)
    check_megatron_model(config, tp_size)
    check_quant(quant, tp_size)
    model = MegatronCausalLM(config, kernels, dtype, tp_size, stock_spec)
    if seed is not None:
        reference = build_model(config, kernels=kernels, dtype=dtype, seed=seed)
        model.load_state_dict_hf(reference.state_dict_hf(), source="random init")
    return fake_quantize_megatron(model, quant)


def from_causal_lm(model, tp_size: int = 1) -> MegatronCausalLM:
    """The Megatron learner holding ``model``'s weights (a project ``CausalLM``), in its config,
    kernel set, dtype and fake-quantized format (``fake_quantize_model``'s, if any): how
    ``rl.learner.build_policy`` makes a ``trainer="megatron"`` learner."""
    from .quantized import check_quant, fake_quantize_megatron

    fmt = getattr(model, "fake_quant_format", None)
    check_quant(fmt, tp_size)
    twin = MegatronCausalLM(model.config, model.kernels, model.dtype, tp_size)
    twin.load_state_dict_hf(model.state_dict_hf(), source=f"{type(model).__name__} weights")
    return fake_quantize_megatron(twin, fmt)
