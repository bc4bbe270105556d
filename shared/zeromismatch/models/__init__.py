"""Model families on the kernel backend: Qwen3, Qwen3-MoE, DeepSeek-V3 (MLA), Nemotron-H.

Every floating-point op of every model goes through a ``KernelSet`` (``model.kernels``), so
switching ``"aligned"`` / ``"default"`` switches all numerics. One definition per family
serves the trainer (packed full sequences, autograd) and the engine (paged KV cache, conv/SSM
state), both described by ``ForwardBatch``. Configs and weights use Hugging Face names
(config.json + safetensors), so real checkpoints of these architectures load unchanged.

Public API: ``ModelConfig``, ``build_model``, ``load_pretrained``, ``save_pretrained``,
``PRESETS``, ``QUANT_FORMATS``, ``quantize_model``, ``fake_quantize_model``, ``CausalLM``,
``ForwardBatch``, ``ModelCache``.
"""

from __future__ import annotations

import torch

from ..kernels.base import KernelSet
from .batch import ForwardBatch, ModelCache
from .causal_lm import CausalLM
from .config import ModelConfig
from .deepseek import DeepseekV3ForCausalLM
from .dense import Qwen3ForCausalLM
from .hybrid import NemotronHForCausalLM
from .loader import load_pretrained, save_pretrained
from .moe import Qwen3MoeForCausalLM
from .presets import PRESETS, TINY_PRESETS, preset_dict
from .quantized import QUANT_FORMATS, fake_quantize_model, quantize_model

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "qwen3": Qwen3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "deepseek_v3": DeepseekV3ForCausalLM,
    "nemotron_h": NemotronHForCausalLM,
}


def resolve_config(config_or_preset: ModelConfig | str | dict) -> ModelConfig:
    if isinstance(config_or_preset, ModelConfig):
        return config_or_preset
    if isinstance(config_or_preset, str):
        return ModelConfig.from_hf_config(preset_dict(config_or_preset))
    if isinstance(config_or_preset, dict):
        return ModelConfig.from_hf_config(config_or_preset)
    raise TypeError(
        f"expected a ModelConfig, preset name or config dict, got {type(config_or_preset).__name__}"
    )


def build_model(
    config_or_preset_name: ModelConfig | str | dict,
    kernels: str | KernelSet = "aligned",
    dtype: torch.dtype = torch.float32,
    seed: int | None = 0,
    tp_group=None,
) -> CausalLM:
    """Instantiate a model; random weights from ``seed`` (``seed=None`` leaves them
    uninitialised for a loader to fill). Sigmoid routers stay fp32 whatever ``dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    config = resolve_config(config_or_preset_name)
    model = MODEL_CLASSES[config.family](config, kernels=kernels, tp_group=tp_group)
    if seed is not None:
        model.init_random(seed)
    model.to(dtype)
    for module in model.modules():
        if getattr(module, "keep_fp32", False):
            module.float()
    return model


__all__ = [
    "PRESETS",
    "QUANT_FORMATS",
    "TINY_PRESETS",
    "CausalLM",
    "ForwardBatch",
    "ModelCache",
    "ModelConfig",
    "build_model",
    "fake_quantize_model",
    "load_pretrained",
    "quantize_model",
    "resolve_config",
    "save_pretrained",
]
