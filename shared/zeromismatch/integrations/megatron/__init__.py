"""A Megatron-core learner on the project's kernels (megatron-core 0.16.1, the ``megatron`` extra).

A Megatron ``GPTModel`` built from layer specs whose modules call the KernelSet for every op
(``specs.py``: linears, norms, RoPE, attention, MLA (``mla.py``), SwiGLU / relu2, MoE routing and
experts, the Mamba2 mixer (``hybrid.py``, in Megatron's ``MambaStack``), the fp32 LM head; families:
Qwen3, Qwen3-MoE, DeepSeek-V3, Nemotron-H; Nemotron-H's model is a ``MambaModel``), wrapped with the
trainer-side interface of the project's ``CausalLM`` (``model.py``), with HF <-> Megatron weight
maps (``weights.py``), tensor parallelism over gloo (``runtime.py``) and the project learner's
fake-quantized forward for FP8 / block-FP8 / NVFP4 weights (``quantized.py``). With the aligned kernels
its logprobs are bitwise the project's engine's. ``docs/megatron.md`` has the map and the numbers.

Nothing here is imported by the core package except lazily, where a config selects
``trainer="megatron"``; importing this package does not import megatron-core.
"""

from __future__ import annotations

from .config import SPEC_FAMILIES, NoMegatronSpecError, check_megatron_model
from .runtime import MEGATRON_CORE_VERSION, MegatronUnavailableError, megatron_available


def build_megatron_model(*args, **kwargs):
    """``model.build_megatron_model`` (imports megatron-core)."""
    from .model import build_megatron_model as build

    return build(*args, **kwargs)


def from_causal_lm(model, tp_size: int = 1):
    """``model.from_causal_lm`` (imports megatron-core)."""
    from .model import from_causal_lm as convert

    return convert(model, tp_size)


__all__ = [
    "MEGATRON_CORE_VERSION",
    "SPEC_FAMILIES",
    "MegatronUnavailableError",
    "NoMegatronSpecError",
    "build_megatron_model",
    "check_megatron_model",
    "from_causal_lm",
    "megatron_available",
]
