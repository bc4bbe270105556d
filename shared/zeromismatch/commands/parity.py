"""``zm parity``: rollout-vs-trainer logprob mismatch on a randomized engine workload; the argument
parsing and output of ``zeromismatch.parity`` (which says what the workload is and what is compared).

    zm parity --model tiny-qwen3 --kernels aligned
    .venv-vllm/bin/zm parity --model tiny-qwen3 --engine vllm     # the rollout on a real vLLM
"""

from __future__ import annotations

import json
import sys

from ..argtypes import int_at_least_or_none

# the harness was defined here first; these names stay importable from here
from ..parity import (  # noqa: F401
    DTYPE_ALIASES,
    DTYPES,
    RL_DTYPES,
    EngineStepFailed,
    build_trainer,
    diff_stats,
    make_workload,
    run_engine_workload,
    run_parity,
    trainer_logprobs,
)


def register(sub) -> None:
    from ..rl.config import ROLLOUT_ENGINES, TRAINERS
    from .numerics import add_numerics_arguments

    p = sub.add_parser("parity", help="rollout-vs-trainer logprob diff on a randomized engine workload")
    p.add_argument("--model", default=None, help="model preset, e.g. tiny-qwen3 (or --checkpoint)")
    p.add_argument(
        "--checkpoint",
        metavar="RUN_DIR",
        default=None,
        help="a zm train run (or its checkpoints/step_N) whose trained weights and task prompts to use",
    )
    p.add_argument("--kernels", default=None,
                   help="kernel set of the trainer and (unless --rollout-kernels) the engine: aligned | "
                        "default | aligned-native")  # fmt: skip
    add_numerics_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--engine", default="zeromismatch", choices=ROLLOUT_ENGINES,
                   help="the rollout side: the project's engine, or a real vLLM serving the project's "
                        "models through the plugin (run from .venv-vllm: make vllm-venv)")  # fmt: skip
    p.add_argument("--tp", type=int, default=1, help="engine tensor-parallel degree")
    p.add_argument("--trainer-tp", type=int, default=1, help="trainer tensor-parallel degree")
    p.add_argument("--trainer", default="zeromismatch", choices=TRAINERS,
                   help="the trainer side's model code: the project's models, or megatron-core on the same "
                        "kernels (extra 'megatron')")  # fmt: skip
    p.add_argument(
        "--prefill-chunk",
        type=int_at_least_or_none(1),
        default=8,
        help="max prompt tokens per request per step; none = no per-request limit",
    )
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-num-batched-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--logprobs-mode", choices=["processed", "raw"], default="processed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..integrations.megatron import MegatronUnavailableError
    from ..integrations.vllm import VllmUnavailableError
    from .numerics import resolve_numerics

    try:
        numerics = resolve_numerics(args, args.kernels, args.rollout_kernels)
        result = run_parity(
            model=args.model,
            kernels=numerics["kernels"],
            rollout_kernels=numerics["rollout_kernels"],
            dtype=numerics["dtype"],
            quant=numerics["quant"],
            rollout_dtype=numerics["rollout_dtype"],
            rollout_quant=numerics["rollout_quant"],
            kv_cache_dtype=numerics["kv_cache_dtype"],
            rollout_lm_head=numerics["rollout_lm_head"],
            checkpoint=args.checkpoint,
            seed=args.seed,
            num_prompts=args.num_prompts,
            max_tokens=args.max_tokens,
            tp=args.tp,
            trainer_tp=args.trainer_tp,
            prefill_chunk=args.prefill_chunk,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            logprobs_mode=args.logprobs_mode,
            trainer=args.trainer,
            engine=args.engine,
        )
    except (ValueError, TypeError, MegatronUnavailableError, VllmUnavailableError) as err:
        print(f"zm parity: {err}", file=sys.stderr)
        return 2
    except EngineStepFailed as err:
        print(f"zm parity: {err}", file=sys.stderr)
        return 1
    from .._provenance import numerics

    result = {**result, "numerics": numerics()}  # e.g. the portable GEMM mode this ran in
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    if not result["informative_tokens"]:
        print("zm parity: every compared logprob is exactly 0; 'identical' says only that both sides "
              "chose the same tokens (use --logprobs-mode raw)", file=sys.stderr)  # fmt: skip
    keys = ["diff_max", "diff_mean", "diff_std", "k3_kl", "tokens", "informative_tokens", "identical"]
    if result["nonfinite_tokens"]:
        keys.insert(keys.index("tokens") + 1, "nonfinite_tokens")
        print(
            f"zm parity: {result['nonfinite_tokens']} sampled token(s) have a non-finite logprob on one "
            "side (outside the trainer's top-k/top-p support); the diff statistics cover the others",
            file=sys.stderr,
        )
    for key in keys:
        print(f"{key:10s} {result[key]}")
    return 0
