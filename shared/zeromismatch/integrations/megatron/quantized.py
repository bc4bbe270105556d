"""The fake-quantized forward of the Megatron learner: the project learner's ``fake_quantize_model``
(``models/quantized.py``) on Megatron's parameter layout.

The project's learner keeps its weights as fp32 (the model's dtype) masters and computes every
forward with ``dequantize(quantize_weight(w, fmt), dtype)`` in their place, per HF tensor (one
``FakeQuantizer`` per ``Linear``, one per routed expert), with a straight-through gradient. The
Megatron model holds some of those HF tensors fused (``linear_qkv``: q, k and v interleaved per query
group; the gated ``linear_fc1``: gate and up) or stacked (routed experts), and a format's scales are
per HF tensor: NVFP4's global scale spans the whole tensor, an FP8 128x128 block of a fused weight
would straddle q and k. So ``MegatronFakeQuantizer`` goes through the parameter's weight map
(``weights.TensorMap``): the parameter is split into its HF tensors (``to_hf``), each passes through
the project's own ``FakeQuantizer`` (the same quantize / dequantize calls, the same straight-through
autograd function), and the results are put back in Megatron's layout (``to_megatron``). The split
and the reassembly are exact copies and views, so the GEMM sees, column for column, the weights the
engine's ``quant_linear`` and the project learner use, and the gradient reaching the master is the
gradient of the fake-quantized weight, as in the project's learner.

Which parameters: those the project quantizes, by module kind: every spec'd linear (column-, row-
parallel and replicated: attention, MLA, MLP / shared-expert, Mamba in/out and latent projections)
and the routed experts; not the embedding, the output layer, norms, routers, conv1d or the Mamba
vectors. ``tests/megatron/test_megatron_quant.py`` checks that this picks exactly the HF tensors the
project's ``fake_quantize_model`` picks. A fake-quantized row-parallel linear runs as one
``kernels.linear`` (not ``row_parallel_linear``), as the project's fake-quantized ``Linear`` does.

Tensor parallelism + quantization is refused, as in the project (``models/quantized.py``): a
format's scales span the full HF tensor, which no TP rank holds.
"""

from __future__ import annotations

import torch

from ...kernels.weight_cache import cached_from_weights
from ...models.quantized import QUANT_FORMATS, FakeQuantizer, _check_nvfp4_shape

#: the settings with no weight format, as ``RLConfig.quant`` / ``zm parity --quant`` spell them
NO_FORMAT = (None, "none")


class MegatronFakeQuantizer:
    """``parameter -> to_megatron([FakeQuantizer_i(hf_i, dtype)])`` for one Megatron parameter,
    ``hf_i`` its HF tensors (``tmap.to_hf``), at TP 1. Under autograd it is rebuilt on every call
    (the pieces are views / copies of the master, so the project's straight-through function hands
    the master its gradient); otherwise the assembled weight is held in the packed-weight cache, which
    rebuilds it once the parameter changes (an optimizer step, ``load_state_dict_hf``), as
    ``FakeQuantizer`` does for a project ``Linear``."""

    def __init__(self, fmt: str, tmap):
        self.format, self.map = fmt, tmap
        # the project's names (its module's, without ".weight"): what its errors say
        self.pieces = tuple(FakeQuantizer(fmt, name.removesuffix(".weight")) for name in tmap.hf)

    def __call__(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if torch.is_grad_enabled() and weight.requires_grad:
            return self._assemble(weight, dtype)
        # an entry built under inference mode is an inference tensor, which autograd may not save
        tag = ("megatron-fake-quantize", self.format, dtype, torch.is_inference_mode_enabled())
        value = cached_from_weights((weight,), tag, lambda: _sized(self._assemble(weight, dtype)))
        return self._assemble(weight, dtype) if value is None else value

    def _assemble(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        pieces = self.map.to_hf([weight])
        return self.map.to_megatron([q(p, dtype) for q, p in zip(self.pieces, pieces)], 0, 1)

    def __repr__(self) -> str:
        return f"MegatronFakeQuantizer({self.format!r}, {self.map.megatron!r})"


def _sized(value: torch.Tensor) -> tuple[torch.Tensor, int]:
    return value, value.numel() * value.element_size()


def check_quant(fmt: str | None, tp_size: int) -> None:
    """One ValueError for a format this learner cannot fake-quantize to (before anything is built)."""
    if fmt in NO_FORMAT:
        return
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {QUANT_FORMATS} or 'none'")
    if tp_size > 1:
        raise ValueError(
            f"the Megatron learner's {fmt} fake quantization needs TP degree 1, got {tp_size} (a format's "
            "scales span the full HF tensor, as in the project's fake_quantize_model)"
        )


def quantized_weights(model) -> dict[str, tuple[torch.nn.Module, str]]:
    """``{megatron parameter name: (module, attribute)}`` of every weight the project quantizes (the
    module docstring), for a ``MegatronCausalLM``."""
    from .layers import (
        KernelColumnParallelLinear,
        KernelOutputLayer,
        KernelReplicatedLinear,
        KernelRowParallelLinear,
    )
    from .moe import KernelMoEExperts

    linears = (KernelColumnParallelLinear, KernelRowParallelLinear, KernelReplicatedLinear)
    out = {}
    for name, module in model.gpt.named_modules():
        if isinstance(module, KernelOutputLayer):
            continue  # the LM head stays dense (fp32 logits), as in FP8 / NVFP4 checkpoints
        if isinstance(module, linears):
            out[f"{name}.weight"] = (module, "weight")
        elif isinstance(module, KernelMoEExperts):
            for attr in ("gate_weight", "up_weight", "down_weight"):
                if getattr(module, attr) is not None:
                    out[f"{name}.{attr}"] = (module, attr)
    return out


def fake_quantize_megatron(model, fmt: str):
    """Make a ``MegatronCausalLM`` a fake-quantized learner for ``fmt``, in place; returns it. Every
    HF tensor's shape is checked before any module changes (NVFP4: in_features divisible by 16)."""
    check_quant(fmt, model.tp_size)
    if fmt in NO_FORMAT:
        return model
    if model.fake_quant_format not in (None, fmt):
        raise ValueError(f"model is already fake-quantized to {model.fake_quant_format!r}")
    maps = {m.megatron: m for m in model.maps}
    params = model._params()
    chosen = {}
    for name, (module, attr) in quantized_weights(model).items():
        tmap = maps[name]
        if fmt == "nvfp4":
            for hf, shape in zip(tmap.hf, tmap.hf_shapes(tuple(params[name].shape))):
                _check_nvfp4_shape(shape, hf.removesuffix(".weight"))
        chosen[(module, attr)] = MegatronFakeQuantizer(fmt, tmap)
    for (module, attr), quantizer in chosen.items():
        module.fake_quant = {**(module.fake_quant or {}), attr: quantizer}
    model.fake_quant_format = fmt
    return model
