"""Named numeric stacks: what the learner and the rollout engine each compute in, in one place.

A stack fixes the numerics of both sides of an RL run -- the learner's kernel set, dtype and weight
format, and the rollout engine's kernel set, dtype, weight format, KV-cache dtype and lm_head -- and
expands into ``RLConfig`` fields (``stack_fields``). Experiments, ``zm train --stack``, ``zm parity
--stack`` and ``zm bisect --stack`` all use these, so "the fast FP8 baseline" means one thing.

- ``aligned-<fmt>``: both sides run exactly the same numerics on one aligned kernel set. With a
  quantized format the learner keeps fp32 master weights and runs its forward through the engine's
  quantize -> dequantize path with a straight-through gradient (``models.fake_quantize_model``), so
  diff and k3 are exactly 0 at every step.
- ``fast-<fmt>``: the published high-performance baseline. The rollout engine runs stock kernels in
  bf16 with low-precision weights re-quantized from the learner's master weights at every weight update
  (as vLLM does when it loads bf16 weights into an FP8/NVFP4 model), an FP8 KV cache and a bf16 head; the
  learner stays at fp32 master weights on its own aligned kernels. Nothing is injected: each difference is
  a numeric path a production stack takes.

Rules every combination obeys (``numerics_problems``): a weight format on the learner is the engine's
too (the learner fake-quantizes only to compute what the engine computes); an FP8 KV cache needs a bf16
rollout.

Launch: ``zm train --stack fast-fp8 --env arithmetic --sft-steps 400 --steps 50 --out runs/fast-fp8``
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.runner import LM_HEAD_PRECISIONS
from ..kernels.quant import KV_CACHE_DTYPES
from ..models.quantized import QUANT_FORMATS

DTYPES = ("float32", "bfloat16")
QUANTS = ("none", *QUANT_FORMATS)
#: the fields a numeric stack sets, learner side first
NUMERICS_FIELDS = (
    "kernels", "dtype", "quant", "rollout_kernels", "rollout_dtype", "rollout_quant", "kv_cache_dtype",
    "rollout_lm_head",
)  # fmt: skip

#: the learner's kernel set of every stack unless ``stack_fields(..., kernels=...)`` says otherwise;
#: ``aligned-native`` has the same contract and bits-level promises, in fixed-order C
DEFAULT_ALIGNED_KERNELS = "aligned"


@dataclass(frozen=True)
class Stack:
    name: str
    stands_for: str  # the published configuration this stack is the mini counterpart of
    not_modelled: str  # what the real stack does that this one does not
    dtype: str  # learner (and, for aligned stacks, engine) dtype
    quant: str  # learner weight format: the engine's format, fake-quantized on fp32 masters
    rollout_kernels: str | None  # None: the learner's kernel set (aligned)
    rollout_dtype: str | None = None  # None: the learner's dtype
    rollout_quant: str | None = None  # None: the learner's format
    kv_cache_dtype: str = "auto"
    rollout_lm_head: str = "fp32"

    @property
    def aligned(self) -> bool:
        return self.rollout_kernels is None and self.rollout_dtype is None and self.rollout_quant is None

    def fields(self, kernels: str = DEFAULT_ALIGNED_KERNELS) -> dict:
        """The ``RLConfig`` fields of this stack with the learner on ``kernels``."""
        return {
            "kernels": kernels,
            "rollout_kernels": self.rollout_kernels,
            "dtype": self.dtype,
            "quant": self.quant,
            "rollout_dtype": self.rollout_dtype,
            "rollout_quant": self.rollout_quant,
            "kv_cache_dtype": self.kv_cache_dtype,
            "rollout_lm_head": self.rollout_lm_head,
        }


def _aligned(fmt: str, dtype: str, stands_for: str, not_modelled: str) -> Stack:
    return Stack(f"aligned-{fmt}", stands_for, not_modelled, dtype=dtype,
                 quant=fmt if fmt not in ("fp32", "bf16") else "none", rollout_kernels=None)  # fmt: skip


def _fast(fmt: str, stands_for: str, not_modelled: str) -> Stack:
    quant = "none" if fmt == "bf16" else fmt
    return Stack(
        f"fast-{fmt}", stands_for, not_modelled, dtype="float32", quant="none", rollout_kernels="default",
        rollout_dtype="bfloat16", rollout_quant=quant, kv_cache_dtype="auto" if fmt == "bf16" else "fp8_e4m3",
        rollout_lm_head="activation",
    )  # fmt: skip


_ALIGNED_QUANT_NOTE = (
    "activations stay fp32 on both sides: an aligned bf16-activation FP8 stack would need a learner with "
    "fp32 masters and a bf16 compute copy of every parameter, which is not built; the KV cache is not FP8"
)
_FAST_NOTE = (
    "real FP8/NVFP4 GEMM kernels (the default set dequantizes and runs a bf16 GEMM with a batch-wide "
    "activation scale), CUDA graphs, tensor parallelism and speculative decoding; the FP8 KV cache is "
    "emulated (dequantized values stored in bf16) with vLLM's unit scales"
)

STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        _aligned("fp32", "float32", "the aligned reference: fp32 everywhere on one aligned kernel set",
                 "nothing: the CPU reference of the contract"),
        _aligned("bf16", "bfloat16", "S1/S3's aligned stacks in their bf16 compute dtype",
                 "fp32 master weights: the learner trains its bf16 parameters directly"),
        _aligned("fp8", "float32", "an aligned FP8 (per-channel) stack: same FP8 weights on both sides",
                 _ALIGNED_QUANT_NOTE),
        _aligned("fp8-block", "float32",
                 "S1's DeepSeek consistent path: 128x128-block FP8 weights on both sides",
                 _ALIGNED_QUANT_NOTE),
        _aligned("nvfp4", "float32", "S1's Nemotron-3.5 consistent run: NVFP4 weights on both sides",
                 _ALIGNED_QUANT_NOTE),
        _fast("bf16", "a bf16 vLLM rollout (bf16 head) against an fp32 trainer", _FAST_NOTE),
        _fast("fp8", "a bf16 vLLM rollout with online per-channel FP8 weights, FP8 KV cache and bf16 head "
                     "against an fp32-master trainer", _FAST_NOTE),
        _fast("fp8-block", "S1's DeepSeek-V4-Flash high-performance baseline (block FP8 weights, FP8 KV, "
                           "bf16 head) against an fp32-master trainer", _FAST_NOTE),
        _fast("nvfp4", "S1's Nemotron-3.5 NVFP4 baseline (NVFP4 weights, FP8 KV, bf16 head) against an "
                       "fp32-master trainer", _FAST_NOTE),
    )
}  # fmt: skip


def get_stack(name: str) -> Stack:
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r}; expected one of {sorted(STACKS)}")
    return STACKS[name]


def stack_fields(name: str, kernels: str = DEFAULT_ALIGNED_KERNELS) -> dict:
    """``RLConfig`` fields of stack ``name`` (``RLConfig(**stack_fields("fast-fp8"), ...)``)."""
    return get_stack(name).fields(kernels)


def inverse_of(name: str) -> str:
    """The stack that differs from aligned stack ``name`` only by taking the fast path: its inverse
    (aligned-fp32 and aligned-bf16 -> fast-bf16)."""
    stack = get_stack(name)
    if not stack.aligned:
        raise ValueError(f"{name} is not an aligned stack")
    fmt = name.removeprefix("aligned-")
    return "fast-bf16" if fmt in ("fp32", "bf16") else f"fast-{fmt}"


def numerics_problems(fields: dict) -> list[tuple[str, str]]:
    """``[(field, why)]`` for every rule the numerics in ``fields`` (``NUMERICS_FIELDS``) break; the
    caller names the field its own way (``RLConfig.quant``, ``--quant``)."""
    problems = []
    if fields["dtype"] not in DTYPES:
        problems.append(("dtype", f"must be one of {DTYPES}"))
    if fields["quant"] not in QUANTS:
        problems.append(("quant", f"must be one of {QUANTS}"))
    if fields["rollout_dtype"] not in (None, *DTYPES):
        problems.append(("rollout_dtype", f"must be None (same as dtype) or one of {DTYPES}"))
    if fields["rollout_quant"] not in (None, *QUANTS):
        problems.append(("rollout_quant", f"must be None (same as quant) or one of {QUANTS}"))
    engine_dtype = fields["rollout_dtype"] or fields["dtype"]
    engine_quant = fields["rollout_quant"] or fields["quant"]
    if fields["quant"] != "none" and engine_quant != fields["quant"]:
        # the learner fake-quantizes only to compute what the engine computes: a format on the trainer
        # side alone models no stack
        problems.append(
            (
                "quant",
                f"a weight format on the learner must be the engine's too (rollout_quant "
                f"is {engine_quant!r}); for a quantized rollout alone set rollout_quant",
            )
        )
    if fields["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        problems.append(("kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}"))
    elif fields["kv_cache_dtype"] != "auto" and engine_dtype != "bfloat16":
        problems.append(
            (
                "kv_cache_dtype",
                f"an FP8 KV cache needs a bfloat16 rollout (vLLM's FP8 KV attention "
                f"backends take bf16/fp16 queries), not {engine_dtype}",
            )
        )
    if fields["rollout_lm_head"] not in LM_HEAD_PRECISIONS:
        problems.append(("rollout_lm_head", f"must be one of {LM_HEAD_PRECISIONS}"))
    return problems
