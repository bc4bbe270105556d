"""The numerics flags ``zm train``, ``zm parity`` and ``zm bisect`` share: ``--stack`` and each side's fields.

``--dtype`` / ``--quant`` mean both sides; ``--rollout-dtype``, ``--rollout-quant``, ``--kv-cache-dtype`` and
``--rollout-lm-head`` the rollout engine alone. ``--stack NAME`` (``rl/stacks.py``) sets all of them at
once; a flag given beside it overrides the stack's value. The result is ``RLConfig``'s numerics fields,
checked by the same rules (``rl.stacks.numerics_problems``), each broken rule named by its flag.
"""

from __future__ import annotations

from ..engine.runner import LM_HEAD_PRECISIONS
from ..kernels.quant import KV_CACHE_DTYPES
from ..rl.stacks import (
    DEFAULT_ALIGNED_KERNELS,
    NUMERICS_FIELDS,
    QUANTS,
    STACKS,
    numerics_problems,
    stack_fields,
)

#: dtype spellings accepted on the command line -> RLConfig's names
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}
#: RLConfig field -> the flag that sets it (kernel flags differ per command)
FLAG_OF = {field: "--" + field.replace("_", "-") for field in NUMERICS_FIELDS}


def add_numerics_arguments(parser, rollout_kernels: bool = True) -> None:
    """Add ``--stack`` and the per-side numerics flags (not ``--kernels``: each command names its own)."""
    parser.add_argument(
        "--stack",
        choices=sorted(STACKS),
        default=None,
        help="a named numeric stack for both sides (aligned-fp32, fast-fp8, ...; rl/stacks.py)",
    )
    if rollout_kernels:
        parser.add_argument(
            "--rollout-kernels", default=None, help="the engine's kernel set (default: the learner's)"
        )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPE_NAMES), default=None, help="both sides' dtype (default fp32)"
    )
    parser.add_argument(
        "--quant",
        choices=QUANTS,
        default=None,
        help="both sides' weight format (the learner fake-quantizes fp32 masters)",
    )
    parser.add_argument(
        "--rollout-dtype",
        choices=sorted(DTYPE_NAMES),
        default=None,
        help="the engine's dtype (default: --dtype)",
    )
    parser.add_argument(
        "--rollout-quant",
        choices=QUANTS,
        default=None,
        help="the engine's weight format, re-quantized at every weight update (default: --quant)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=None,
        help="the engine's KV cache (fp8_e4m3 needs a bf16 rollout)",
    )
    parser.add_argument("--rollout-lm-head", choices=LM_HEAD_PRECISIONS, default=None,
                        help="the engine's head: fp32, or activation (bf16 on a bf16 rollout)")  # fmt: skip


def resolve_numerics(args, kernels: str | None, rollout_kernels: str | None = None) -> dict:
    """RLConfig's numerics fields from ``args``: defaults, then the stack, then each flag given.
    ``kernels`` / ``rollout_kernels`` are the command's own kernel flags (None: not given).
    Raises ValueError naming the flag of the first broken rule."""
    fields = {
        "kernels": DEFAULT_ALIGNED_KERNELS, "rollout_kernels": None, "dtype": "float32", "quant": "none",
        "rollout_dtype": None, "rollout_quant": None, "kv_cache_dtype": "auto", "rollout_lm_head": "fp32",
    }  # fmt: skip
    if args.stack is not None:
        fields.update(stack_fields(args.stack, kernels or DEFAULT_ALIGNED_KERNELS))
    given = {
        "kernels": kernels, "rollout_kernels": rollout_kernels,
        "dtype": DTYPE_NAMES.get(args.dtype), "quant": args.quant,
        "rollout_dtype": DTYPE_NAMES.get(args.rollout_dtype), "rollout_quant": args.rollout_quant,
        "kv_cache_dtype": args.kv_cache_dtype, "rollout_lm_head": args.rollout_lm_head,
    }  # fmt: skip
    fields.update({key: value for key, value in given.items() if value is not None})
    for field, why in numerics_problems(fields):
        raise ValueError(f"{FLAG_OF[field]}: {why} (got {fields[field]!r})")
    return fields


def describe(fields: dict) -> str:
    """One line: what each side computes in."""
    learner = f"learner {fields['kernels']}/{fields['dtype']}/{fields['quant']}"
    rollout = (
        f"rollout {fields['rollout_kernels'] or fields['kernels']}"
        f"/{fields['rollout_dtype'] or fields['dtype']}"
        f"/{fields['rollout_quant'] or fields['quant']}/kv {fields['kv_cache_dtype']}"
        f"/head {fields['rollout_lm_head']}"
    )
    return f"{learner}; {rollout}"
