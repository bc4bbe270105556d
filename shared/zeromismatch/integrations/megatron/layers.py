"""Megatron modules whose arithmetic is the KernelSet's: linears, RMSNorm, the output layer.

Each subclasses (or stands in for) the Megatron module a layer spec names, keeps Megatron's
parameters, sharding and autograd communication, and replaces only the arithmetic:

- ``KernelColumnParallelLinear``: Megatron's ``ColumnParallelLinear`` (its output-dim shard, its
  gather and its backward all-reduce of the input gradient) whose GEMM is ``kernels.linear``.
  The aligned ``linear`` gives a column subset of the weight the bits of the same columns of the
  full product, so a rank's shard computes exactly what TP 1 computes for those columns.
- ``KernelRowParallelLinear``: ``RowParallelLinear`` whose GEMM *and reduction* are
  ``kernels.row_parallel_linear`` over Megatron's TP group, with the project's fixed virtual
  shards (``models.layers.VIRTUAL_SHARDS``): the aligned set sums them in one fixed tree, so TP 1
  and TP 2 give the same bits. Its gather is differentiable (``kernels.collectives``), the
  backward of Megatron's reduce (identity per rank).
- ``KernelReplicatedLinear``: a linear held whole on every rank (``kernels.linear``).
- ``KernelRMSNorm``: ``kernels.rms_norm`` (input, pre-MLP, q/k and final norms).
- ``KernelOutputLayer``: the vocab-parallel output layer on ``kernels.lm_head`` (fp32 logits in the
  aligned set), gathered over the vocabulary by Megatron.

The linears' ``fake_quant`` (None unless the model is fake-quantized, ``quantized.py``) gives the
weight the GEMM uses: ``kernels.linear(x, fake-quantized W)``, the row-parallel one included (TP 1).

The kernel set lives in a ``KernelSlot`` shared by every module of one model, so switching it
(``MegatronCausalLM.set_kernels``) switches all numerics at once, as ``CausalLM.set_kernels`` does.
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region
from torch.nn import Parameter

from ...kernels import get_kernels
from ...kernels.base import KernelSet
from ...kernels.collectives import all_gather_stacked
from ...models.layers import VIRTUAL_SHARDS


class KernelSlot:
    """The one mutable reference to a model's KernelSet that all of its modules read."""

    def __init__(self, kernels: str | KernelSet):
        self.kernels = get_kernels(kernels)

    def __deepcopy__(self, memo):  # a KernelSet is a process-wide singleton: never copied
        return KernelSlot(self.kernels)


def gemm_weight(linear, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight a spec'd linear's GEMM uses: its fake-quantized form when the model is fake-quantized
    (``linear.fake_quant``, set by ``quantized.py``), else ``weight`` itself."""
    return weight if linear.fake_quant is None else linear.fake_quant["weight"](weight, dtype)


class KernelColumnParallelLinear(ColumnParallelLinear):
    """``ColumnParallelLinear`` with its local GEMM on ``kernels.linear``."""

    def __init__(self, *args, kernels: KernelSlot, **kwargs):
        super().__init__(*args, **kwargs)
        self.slot = kernels
        self.fake_quant = None  # {"weight": MegatronFakeQuantizer} once fake-quantized (quantized.py)

    def _forward_impl(self, input, weight, bias=None, allreduce_dgrad=False, tp_group=None, **_unused):
        # Megatron's own kernel all-reduces the input gradient over the TP group when
        # ``allreduce_dgrad``; here the copy-to-TP-region autograd op does that reduction
        if allreduce_dgrad:
            input = copy_to_tensor_model_parallel_region(input, group=tp_group)
        return self._gemm(input, weight, bias)

    def _gemm(self, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        return self.slot.kernels.linear(x, gemm_weight(self, weight, x.dtype), bias)


class KernelOutputLayer(KernelColumnParallelLinear):
    """The output layer (``GPTModel.output_layer``) on ``kernels.lm_head``: fp32 logits over this
    rank's vocabulary shard, gathered over the vocabulary when ``gather_output``. The gather is the
    project's differentiable all-gather (every rank then uses the full logits alike, so a rank's
    gradient is its own slice): Megatron's allocates its buffer on ``torch.cuda.current_device()``."""

    @classmethod
    def for_model(cls, model, kernel_slot: KernelSlot, tied: bool = False) -> KernelOutputLayer:
        """The output layer replacing a built Megatron model's (``GPTModel`` or ``MambaModel``): no
        bias, gathered unless the model keeps parallel logits; ``tied``: the embedding's weight is used."""
        config = model.config
        return cls(
            config.hidden_size, model.vocab_size, config=config, init_method=config.init_method, bias=False,
            skip_bias_add=False, gather_output=not model.parallel_output, skip_weight_param_allocation=tied,
            tp_group=model.pg_collection.tp, kernels=kernel_slot,
        )  # fmt: skip

    def forward(self, input_, weight=None, runtime_gather_output=None):
        local, bias = super().forward(input_, weight, runtime_gather_output=False)
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather and self.tp_group.size() > 1:
            local = torch.cat(all_gather_stacked(local, self.tp_group).unbind(0), dim=-1)
        return local, bias

    def _gemm(self, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        if bias is not None:
            raise ValueError("the output layer has no bias")
        logits = self.slot.kernels.lm_head(x, weight)
        return logits.reshape(*x.shape[:-1], logits.shape[-1])


class KernelRowParallelLinear(RowParallelLinear):
    """``RowParallelLinear`` whose GEMM and TP reduction are ``kernels.row_parallel_linear``; the
    bias (if any) is added after the reduction, inside the kernel, and never returned separately."""

    def __init__(self, *args, kernels: KernelSlot, **kwargs):
        super().__init__(*args, **kwargs)
        self.slot = kernels
        self.fake_quant = None  # {"weight": MegatronFakeQuantizer} once fake-quantized (quantized.py)
        if not self.input_is_parallel or self.sequence_parallel or self.explicit_expert_comm:
            raise ValueError(
                "KernelRowParallelLinear supports input_is_parallel=True without sequence or expert "
                "parallelism only"
            )

    def forward(self, input_: torch.Tensor):
        if self.fake_quant is not None:
            # one GEMM on the fake-quantized weight, as the project's fake-quantized Linear runs its
            # row-parallel layers (quantization is TP 1 only: there is nothing to reduce)
            weight = gemm_weight(self, self.weight, input_.dtype)
            return self.slot.kernels.linear(input_, weight, self.bias), None
        group = self.tp_group if self.tp_group.size() > 1 else None
        out = self.slot.kernels.row_parallel_linear(input_, self.weight, self.bias, group, VIRTUAL_SHARDS)
        return out, None


class KernelReplicatedLinear(torch.nn.Module):
    """A linear held whole on every TP rank (Megatron's "duplicated" parallel mode: MLA's q/kv down
    projections, Nemotron-H's Mamba projections and MoE latent projections) on ``kernels.linear``;
    returns ``(output, None)`` like Megatron's linears. Every rank computes the same output, so its
    gradients need no reduction as long as the output's gradient is complete on every rank."""

    def __init__(self, input_size: int, output_size: int, *, config, kernels: KernelSlot, bias: bool = False,
                 **_unused):  # fmt: skip
        super().__init__()
        self.slot = kernels
        dtype = config.params_dtype
        self.weight = Parameter(torch.empty(output_size, input_size, dtype=dtype))
        self.bias = Parameter(torch.empty(output_size, dtype=dtype)) if bias else None
        self.fake_quant = None  # {"weight": MegatronFakeQuantizer} once fake-quantized (quantized.py)

    def forward(self, x: torch.Tensor):
        return self.slot.kernels.linear(x, gemm_weight(self, self.weight, x.dtype), self.bias), None


class KernelRMSNorm(torch.nn.Module):
    """RMSNorm on ``kernels.rms_norm`` (built by Megatron as ``module(config=, hidden_size=, eps=)``).

    ``per_head_shard=True`` (the q/k norms): the weight is replicated but each TP rank applies it
    to its own heads only, so its gradient is a partial sum per rank. Megatron sums it over the TP
    group after the backward (``finalize_model_grads``, part of its DDP wrapper, which this learner
    does not use); here the weight passes through Megatron's copy-to-TP-region op, identity forward
    and an all-reduce of the gradient in the backward, so ``.grad`` is complete when backward returns."""

    def __init__(
        self, config, hidden_size: int, eps: float = 1e-5, *, kernels: KernelSlot,
        per_head_shard: bool = False,
    ):  # fmt: skip
        super().__init__()
        self.slot = kernels
        self.eps = eps
        self.weight = Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel  # read by Megatron's grad utilities
        self.per_head_shard = per_head_shard and config.tensor_model_parallel_size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if self.per_head_shard and torch.is_grad_enabled() and weight.requires_grad:
            weight = copy_to_tensor_model_parallel_region(weight)
        return self.slot.kernels.rms_norm(x, weight, self.eps)
