"""``quantize_model``: FP8 (the DeepSeek path) or NVFP4 (the Nemotron path) linear weights.

Every ``Linear`` (attention projections, MLA low-rank projections, MLP/shared-expert
projections, Mamba2 in/out projections, Nemotron latent projections) gets its dense weight
replaced by a ``QuantizedWeight`` (kernels/quant.py) and from then on runs through
``kernels.quant_linear``. Routed experts are quantized per expert too; because the
``moe_experts`` kernel contract takes dense weights, they run as ``dequantize(quantize(w))``
(kernels/quant.py ``cached_dequantize``), which is the same elementwise, deterministic
computation on the rollout and the trainer side. Left dense, as in FP8/NVFP4 checkpoints:
embeddings, lm_head, norms, MoE routers (and their correction bias), conv1d, A_log/D/dt_bias.

FP8 uses DeepSeek-V3's 128x128 block scales; NVFP4 uses 16-element blocks with an e4m3 scale
each and one fp32 global scale. ``load_state_dict_hf`` on a quantized model re-quantizes the
incoming dense weights (the engine's weight update path); ``state_dict_hf`` refuses, since a
quantized model no longer holds the dense weights.

Tensor parallelism + quantization is not supported (``quant_linear`` has no row-parallel form).
"""

from __future__ import annotations

from functools import partial

import torch

from ..kernels import quant
from .causal_lm import CausalLM
from .layers import Linear
from .moe import Experts

QUANT_FORMATS = ("fp8", "nvfp4")
FP8_BLOCK = (128, 128)


def quantize_weight(weight: torch.Tensor, fmt: str, name: str = "weight"):
    """One dense ``[out, in]`` weight -> QuantizedWeight in ``fmt``."""
    if fmt == "fp8":
        return quant.quantize_fp8(weight, block=FP8_BLOCK)
    if fmt == "nvfp4":
        if weight.shape[1] % quant.NVFP4_BLOCK:
            raise ValueError(f"{name}: nvfp4 needs in_features divisible by 16, got {tuple(weight.shape)}")
        return quant.quantize_nvfp4(weight)
    raise ValueError(f"unknown quantization format {fmt!r}; expected one of {QUANT_FORMATS}")


def quantize_model(model: CausalLM, fmt: str) -> CausalLM:
    """Quantize ``model``'s linear weights in place to ``fmt`` ("fp8" | "nvfp4"); returns it."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r}; expected one of {QUANT_FORMATS}")
    if not isinstance(model, CausalLM):
        raise TypeError(f"quantize_model takes a CausalLM, got {type(model).__name__}")
    if model.tp.world_size > 1:
        raise ValueError("quantize_model does not support tensor parallelism (TP degree must be 1)")
    if getattr(model, "quant_format", None) not in (None, fmt):
        raise ValueError(f"model is already quantized to {model.quant_format!r}")
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
