"""``zm bisect``: the first operator where the rollout engine and the trainer diverge.

Runs the same teacher-forced tokens through the engine (``--rollout-kernels``) and the
trainer (``--trainer-kernels``), each in its own numerics (``--stack`` or the per-side flags
``zm train`` and ``zm parity`` share: dtype, weight format, the engine's KV cache and head),
records every kernel call on both sides, and reports the first op (trainer execution order:
layer by layer, then the head) whose output differs for some token -- bitwise, or by value
where the two sides' dtypes differ -- with its diff, shapes, dtypes and the downstream per-token
logprob mismatch. ``--out DIR`` writes a standalone repro of that op; ``--perturb OP@LAYER``
plants a one-ulp change in one engine-side op output to show the tool finds it.

Exit status: 0 no divergence, 1 a divergence was found, 2 bad input.
"""

from __future__ import annotations

import json
import sys

SEED_LIMIT = 2**63


def register(sub) -> None:
    from ..argtypes import int_at_least_or_none
    from ..bisect.recorder import KERNEL_OPS
    from .numerics import add_numerics_arguments

    p = sub.add_parser(
        "bisect",
        help="find the first op whose output differs between rollout and trainer; write a minimal repro",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--model", required=True, help="model preset, e.g. tiny-qwen3")
    p.add_argument(
        "--rollout-kernels",
        help="kernel set of the engine side (aligned | default); required unless --stack gives it",
    )
    p.add_argument(
        "--trainer-kernels", help="kernel set of the trainer side; required unless --stack gives it"
    )
    add_numerics_arguments(p, rollout_kernels=False)
    p.add_argument("--seed", type=int, default=0, help="weights and tokens seed")
    p.add_argument(
        "--perturb",
        metavar="OP@LAYER",
        help=f"plant one ulp in the engine's OP output at LAYER (int or 'head'); OP: {', '.join(KERNEL_OPS)}",
    )
    p.add_argument("--out", metavar="DIR", help="write the minimal repro of the first divergence here")
    p.add_argument("--num-seqs", type=int, default=3)
    p.add_argument("--max-prompt-len", type=int, default=10)
    p.add_argument("--max-response-len", type=int, default=6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--logprobs-mode", choices=["processed", "raw"], default="processed")
    p.add_argument(
        "--prefill-chunk",
        type=int_at_least_or_none(1),
        default=4,
        help="engine: max prompt tokens per request per step; none = whole prompts in one step",
    )
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-num-batched-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


#: ``rl.stacks`` dtype names -> BisectConfig's
_SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def config_from_args(args):
    """The ``BisectConfig`` of parsed ``zm bisect`` arguments: the numerics resolved as ``zm parity``
    resolves them (``commands.numerics.resolve_numerics``; the stack's kernel sets unless a kernel
    flag is given). Raises ValueError naming the flag of a broken rule."""
    from ..bisect.driver import BisectConfig
    from .numerics import resolve_numerics

    if args.stack is None:
        missing = [flag for flag in ("rollout_kernels", "trainer_kernels") if getattr(args, flag) is None]
        if missing:
            flags = " and ".join("--" + flag.replace("_", "-") for flag in missing)
            raise ValueError(f"{flags} {'is' if len(missing) == 1 else 'are'} required without --stack")
    numerics = resolve_numerics(args, args.trainer_kernels, args.rollout_kernels)
    return BisectConfig(
        model=args.model,
        rollout_kernels=numerics["rollout_kernels"] or numerics["kernels"],
        trainer_kernels=numerics["kernels"],
        seed=args.seed,
        num_seqs=args.num_seqs,
        max_prompt_len=args.max_prompt_len,
        max_response_len=args.max_response_len,
        dtype=_SHORT_DTYPE[numerics["dtype"]],
        quant=numerics["quant"],
        rollout_dtype=_SHORT_DTYPE.get(numerics["rollout_dtype"]),
        rollout_quant=numerics["rollout_quant"],
        kv_cache_dtype=numerics["kv_cache_dtype"],
        rollout_lm_head=numerics["rollout_lm_head"],
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        logprobs_mode=args.logprobs_mode,
        prefill_chunk=args.prefill_chunk,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        perturb=args.perturb,
    )


def run(args) -> int:
    from ..bisect.report import format_text, run_bisect
    from ..bisect.repro import write_repro
    from ..io import check_directory_path

    try:
        # torch generators take the seed as a 64-bit integer; stay within the signed range
        if not 0 <= args.seed < SEED_LIMIT:
            raise ValueError(f"--seed must be in [0, {SEED_LIMIT}), got {args.seed}")
        if args.out is not None:  # checked now, not after the whole bisection
            check_directory_path(args.out, "--out")
        config = config_from_args(args)
    except ValueError as err:
        print(f"zm bisect: {err}", file=sys.stderr)
        return 2
    try:
        result = run_bisect(config)
    except (ValueError, TypeError) as err:
        print(f"zm bisect: {err}", file=sys.stderr)
        return 2
    repro = None
    if args.out and result.diverged:
        repro = write_repro(result, args.out)
    if args.json:
        out = result.to_dict()
        out["repro"] = None if repro is None else {"dir": str(args.out), **repro}
        print(json.dumps(out, sort_keys=True, default=str))
    else:
        print(format_text(result))
        if repro is not None:
            print(f"\nrepro written to {args.out}: python {args.out}/repro.py")
        elif args.out:
            print(f"\nno divergence: nothing written to {args.out}")
    return 1 if result.diverged else 0
