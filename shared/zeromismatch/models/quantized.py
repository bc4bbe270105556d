"""Quantized weights for the engine (``quantize_model``) and fake-quantized masters for the learner
(``fake_quantize_model``).

Formats (``QUANT_FORMATS``, named as vLLM names the checkpoints; rules in kernels/quant.py):
``"fp8"`` FP8 e4m3 with one scale per output channel; ``"fp8-block"`` FP8 e4m3 with DeepSeek-V3's
128x128 block scales; ``"nvfp4"`` e2m1 with an e4m3 scale per 16 input elements and an fp32
global scale (needs every quantized weight's input dim divisible by 16).

Which weights: every ``Linear`` (attention projections, MLA low-rank projections, MLP/shared-expert
projections, Mamba2 in/out projections, Nemotron latent projections) and the routed experts, per
expert. Left dense, as in FP8/NVFP4 checkpoints: embeddings, lm_head, norms, MoE routers (and their
correction bias), conv1d, A_log/D/dt_bias.

``quantize_model`` (the rollout engine): a Linear's dense weight is replaced by a
``QuantizedWeight`` and runs through ``kernels.quant_linear``. Because the ``moe_experts`` kernel
contract takes dense weights, routed experts run as ``dequantize(quantize(w), fp32)``
(kernels/quant.py ``cached_dequantize``). ``load_state_dict_hf`` re-quantizes the incoming dense
weights (the engine's weight update path); ``state_dict_hf`` refuses, since the model no longer
holds them.

``fake_quantize_model`` (the learner): the same weights stay fp32 (the model's dtype) master
``nn.Parameter``s, and every forward uses ``dequantize(quantize_weight(w, fmt), dtype)`` in their
place, the weight the engine's kernels compute with, so an aligned learner gives the engine's bits.
The gradient passes straight through: d(loss)/d(master) is d(loss)/d(fake-quantized weight).
``state_dict_hf`` / ``load_state_dict_hf`` exchange the masters unchanged; the engine's
``load_state_dict_hf`` quantizes them.

Tensor parallelism + quantization is not supported (``quant_linear`` has no row-parallel form).
"""

from __future__ import annotations

from functools import partial

import torch

from ..kernels import quant
from ..kernels.weight_cache import cached_from_weights
from .causal_lm import CausalLM
from .layers import Linear
from .moe import Experts

#: weight formats, as vLLM names them; the one list every other place derives from
QUANT_FORMATS = ("fp8", "fp8-block", "nvfp4")
#: DeepSeek-V3's FP8 weight blocks (``weight_block_size`` in its config.json)
FP8_BLOCK = (128, 128)


def quantize_weight(weight: torch.Tensor, fmt: str, name: str = "weight"):
    """One dense ``[out, in]`` weight -> QuantizedWeight in ``fmt`` (``QuantizedWeight.format`` is
    the storage format: "fp8" for both FP8 formats, with ``block`` telling them apart). A weight
    that cannot be quantized (non-finite values; nvfp4: in_features not divisible by 16) raises one
    ValueError naming it."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {QUANT_FORMATS}")
    if fmt == "nvfp4":
        _check_nvfp4_shape(weight.shape, name)
    try:
        if fmt == "nvfp4":
            return quant.quantize_nvfp4(weight)
        return quant.quantize_fp8(weight, block=FP8_BLOCK if fmt == "fp8-block" else None)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _check_nvfp4_shape(shape, name: str) -> None:
    if shape[-1] % quant.NVFP4_BLOCK:
        raise ValueError(f"{name}: nvfp4 needs in_features divisible by 16, got {tuple(shape)}")


def _check_model(model: CausalLM, fmt: str, what: str) -> None:
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {QUANT_FORMATS}")
    if not isinstance(model, CausalLM):
        raise TypeError(f"{what} takes a CausalLM, got {type(model).__name__}")
    if model.tp.world_size > 1:
        raise ValueError(f"{what} does not support tensor parallelism (TP degree must be 1)")


def quantize_model(model: CausalLM, fmt: str) -> CausalLM:
    """Quantize ``model``'s linear weights in place to ``fmt`` (one of ``QUANT_FORMATS``); returns it."""
    _check_model(model, fmt, "quantize_model")
    if getattr(model, "quant_format", None) not in (None, fmt):
        raise ValueError(f"model is already quantized to {model.quant_format!r}")
    if getattr(model, "fake_quant_format", None) is not None:
        raise ValueError(
            f"model is fake-quantized ({model.fake_quant_format!r}): quantize a copy for the engine, "
            "keep this one as the learner's masters"
        )
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, Linear) and module.qweight is None:
                module.qweight = quantize_weight(module.weight, fmt, name)
                module.quant_format = fmt
                module.requantize = partial(quantize_weight, fmt=fmt, name=name)
                module.weight = None
            elif isinstance(module, Experts) and module.quantized is None:
                quantized = {}
                for proj in module.projection_names():
                    stacked = getattr(module, proj)
                    quantized[proj] = [
                        quantize_weight(stacked[e], fmt, f"{name}.{e}.{proj}")
                        for e in range(module.num_experts)
                    ]
                    setattr(module, proj, None)
                module.quantized = quantized
                module.dequantize = partial(quant.cached_dequantize, dtype=torch.float32)
                module.requantize = partial(quantize_weight, fmt=fmt, name=name)
    model.quant_format = fmt
    return model


# ---- fake quantization (the learner) ------------------------------------------------------------
class _StraightThrough(torch.autograd.Function):
    """Forward: ``build(master)`` (the fake-quantized weight); backward: the incoming gradient,
    cast to the master's dtype, is the master's gradient (the straight-through estimator)."""

    @staticmethod
    def forward(ctx, master: torch.Tensor, build):
        ctx.master_dtype = master.dtype
        return build(master)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.master_dtype), None


class FakeQuantizer:
    """``weight -> dequantize(quantize_weight(weight, format), dtype)`` for one weight: ``[out, in]``
    (a Linear's; ``name`` a str) or stacked ``[E, out, in]`` (one routed-expert projection, quantized
    per expert as ``quantize_model`` does; ``name`` one name per expert). ``fake_quantize_model`` sets
    ``Linear.fake_quant`` to one and ``Experts.fake_quant`` to one per projection name.

    Under autograd (grad enabled and the weight requires it) it is recomputed on every call through
    ``_StraightThrough``; otherwise it is held in the packed-weight cache
    (``kernels/aligned/gemm.py::cached_from_weights``), which rebuilds it once the weight's storage
    or in-place version changes (an optimizer step, ``load_state_dict_hf``), so eval forwards do not
    re-quantize every call."""

    def __init__(self, fmt: str, name: str | tuple[str, ...]):
        self.format, self.name = fmt, name

    def __call__(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        build = partial(self._build, dtype=dtype)
        if torch.is_grad_enabled() and weight.requires_grad:
            return _StraightThrough.apply(weight, build)
        # an entry built under inference mode is an inference tensor, which autograd may not save:
        # it is kept apart from the entries that serve no_grad / frozen-weight forwards
        tag = ("fake-quantize", self.format, dtype, torch.is_inference_mode_enabled())
        value = cached_from_weights((weight,), tag, lambda: _sized(build(weight)))
        return build(weight) if value is None else value

    def _build(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        w = weight.detach()
        if w.dim() == 2:
            return quant.dequantize(quantize_weight(w, self.format, self.name), dtype)
        return torch.stack(
            [quant.dequantize(quantize_weight(w[e], self.format, self.name[e]), dtype) for e in range(len(w))]
        )

    def __repr__(self) -> str:
        return f"FakeQuantizer({self.format!r}, {self.name!r})"


def _sized(value: torch.Tensor) -> tuple[torch.Tensor, int]:
    return value, value.numel() * value.element_size()


def fake_quantize_model(model: CausalLM, fmt: str) -> CausalLM:
    """Make ``model`` a fake-quantized learner for ``fmt`` (one of ``QUANT_FORMATS``), in place;
    returns it. The weights ``quantize_model`` would quantize keep their Parameters (the masters);
    from now on each forward uses their fake-quantized value (``FakeQuantizer``), with a
    straight-through gradient. Every weight's shape is checked before any module changes."""
    _check_model(model, fmt, "fake_quantize_model")
    if getattr(model, "quant_format", None) is not None:
        raise ValueError(f"model is quantized to {model.quant_format!r}; it has no dense masters to train")
    if getattr(model, "fake_quant_format", None) not in (None, fmt):
        raise ValueError(f"model is already fake-quantized to {model.fake_quant_format!r}")
    quantizers = {}  # module -> what its fake_quant becomes
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.fake_quant is None:
            if fmt == "nvfp4":
                _check_nvfp4_shape(module.weight.shape, name)
            quantizers[module] = FakeQuantizer(fmt, name)
        elif isinstance(module, Experts) and module.fake_quant is None:
            per_projection = {}
            for proj in module.projection_names():
                if fmt == "nvfp4":
                    _check_nvfp4_shape(getattr(module, proj).shape, f"{name}.{proj}")
                # one name per expert, the HF one quantize_model's errors use
                names = tuple(f"{name}.{e}.{proj}" for e in range(module.num_experts))
                per_projection[proj] = FakeQuantizer(fmt, names)
            quantizers[module] = per_projection
    for module, quantizer in quantizers.items():
        module.fake_quant = quantizer
    model.fake_quant_format = fmt
    return model


__all__ = [
    "FP8_BLOCK",
    "QUANT_FORMATS",
    "FakeQuantizer",
    "fake_quantize_model",
    "quantize_model",
    "quantize_weight",
]
