"""Importing megatron-core and setting up its parallel state: the one place that does either.

megatron-core 0.16.1 is pure Python, but its modules read their tensor-parallel group from
``megatron.core.parallel_state``, which needs ``torch.distributed`` initialised. On a CPU that is
gloo: one process with an in-memory store at tensor-parallel degree 1, or the caller's process
group (``engine.tp.run_spmd`` workers, torchrun) at degree > 1. ``ensure_parallel_state`` is
idempotent: a second call with the same degree is a no-op, a different degree is one error.
Only tensor parallelism is set up (pipeline, context, expert and data parallel sizes stay 1):
the learner's world is its TP group.
"""

from __future__ import annotations

import importlib.util
import warnings

#: the megatron-core release this integration is written and tested against (pinned in the
#: ``megatron`` extra and constraints.txt)
MEGATRON_CORE_VERSION = "0.16.1"


class MegatronUnavailableError(ImportError):
    """megatron-core is not installed (the ``megatron`` extra) or is another version."""


def megatron_available() -> bool:
    """Whether megatron-core can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ModuleNotFoundError, ValueError):  # no ``megatron`` package, or one hidden by None
        return False


def import_megatron():
    """``megatron.core``, imported once with its CPU-fallback warnings silenced (Transformer Engine,
    Apex and the fused CUDA kernels are absent on purpose: every op runs through a KernelSet).
    MegatronUnavailableError naming the extra when it is missing or another version."""
    if not megatron_available():
        raise MegatronUnavailableError(
            "the Megatron learner needs megatron-core (extra 'megatron': pip install -e '.[megatron]'); "
            "it is not installed"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core as core
        import megatron.core.models.gpt.gpt_model  # noqa: F401  (imports the rest of the stack)
    version = getattr(core, "__version__", "unknown")
    if version != MEGATRON_CORE_VERSION:
        raise MegatronUnavailableError(
            f"the Megatron learner is written for megatron-core {MEGATRON_CORE_VERSION}; found {version}"
        )
    return core


def ensure_parallel_state(tp_size: int = 1) -> None:
    """torch.distributed (gloo) + Megatron's model-parallel groups at tensor-parallel degree
    ``tp_size`` + its RNG tracker, unless already set up at that degree.

    Degree 1 in a process without a process group creates a one-rank gloo group on an in-memory
    store. Degree > 1 needs the caller's process group (one rank per TP rank): its world size must
    equal ``tp_size``."""
    import torch.distributed as dist

    import_megatron()
    from megatron.core import parallel_state, tensor_parallel

    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"tensor-parallel degree must be a positive int, got {tp_size!r}")
    if not dist.is_initialized():
        if tp_size != 1:
            raise ValueError(
                f"tensor-parallel degree {tp_size} needs torch.distributed initialised with {tp_size} "
                "ranks (engine.tp.run_spmd or torchrun); this process has no process group"
            )
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if world != tp_size:
        raise ValueError(
            f"tensor-parallel degree {tp_size} must equal the world size {world}: the Megatron learner "
            "uses tensor parallelism only (no data or pipeline parallelism)"
        )
    if parallel_state.model_parallel_is_initialized():
        current = parallel_state.get_tensor_model_parallel_world_size()
        if current != tp_size:
            raise ValueError(
                f"Megatron's parallel state is already set up at tensor-parallel degree {current}; "
                f"got {tp_size}"
            )
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    tensor_parallel.random.initialize_rng_tracker()


def tp_group():
    """Megatron's tensor-parallel process group (after ``ensure_parallel_state``)."""
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def tp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )
