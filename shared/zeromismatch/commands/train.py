"""``zm train``: one RL run (sync or async, in-process or Ray) into --out.

    zm train --env arithmetic --model tiny-qwen3 --algo reinforce_zero --kernels aligned \
             --lag 8 --steps 50 --seed 0 --out runs/arith-lag8

Writes metrics.jsonl (one record per step), summary.json, provenance.json and config.json;
``--resume`` continues from the last checkpoint bit for bit. Numerics per side: ``--stack`` (e.g.
``fast-fp8``: a bf16 FP8 rollout with an FP8 KV cache and a bf16 head against the fp32 learner) or the
flags of ``commands/numerics.py``. ``--trainer megatron`` runs the learner's recompute, loss and optimizer
step on a Megatron-core model over the same kernels (``zeromismatch.integrations.megatron``);
``--rollout-engine vllm`` samples the episodes with a real vLLM serving the plugin
(``zeromismatch.integrations.vllm``, from ``.venv-vllm``).

A run's own failures (a bad flag or config, a corrupt or incomplete checkpoint, an unwritable --out,
a full disk, --out in use by another run) are one line on stderr naming the file or flag, exit 2;
what the run had already written stays as it was.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    from ..rl.config import ALGOS, EXECUTORS, ROLLOUT_ENGINES, TRAINERS, UPDATE_MODES
    from .numerics import add_numerics_arguments

    p = sub.add_parser("train", help="run REINFORCE Zero / GRPO / GSPO / PPO-clip / TIS on a verifiable env")
    p.add_argument("--env", default="arithmetic", help="arithmetic | tools | code_repair | desktop")
    p.add_argument("--model", default="tiny-qwen3", help="model preset (tiny-qwen3, tiny-qwen3-moe, ...)")
    p.add_argument("--algo", default="reinforce_zero", choices=ALGOS)
    p.add_argument(
        "--kernels",
        default=None,
        help="learner kernel set (aligned | default | aligned-native; default aligned)",
    )
    add_numerics_arguments(p)
    p.add_argument("--trainer", default="zeromismatch", choices=TRAINERS,
                   help="the learner's model code: the project's models, or megatron-core on the same "
                        "kernels (extra 'megatron')")  # fmt: skip
    p.add_argument("--rollout-engine", default="zeromismatch", choices=ROLLOUT_ENGINES,
                   help="the engine that samples episodes: the project's own, or a real vLLM serving the "
                        "project's models through the plugin (from .venv-vllm: make vllm-venv)")  # fmt: skip
    p.add_argument("--lag", type=int, default=0, help="maximum policy lag k (0 = synchronous), up to 64")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--sft-steps", type=int, default=0, help="supervised warm start on env demonstrations")
    p.add_argument("--warm-start", default="own", choices=("own", "shared"),
                   help="own: SFT in this run's numerics; shared: one fp32 aligned SFT per recipe, cached in "
                        "runs/warm_starts/ and loaded by every run with that recipe")  # fmt: skip
    p.add_argument("--sft-seed", type=int, default=None, help="shared warm start seed (default: --seed)")
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-size", type=int, default=32)
    p.add_argument(
        "--eval-samples",
        type=int,
        default=4,
        help="samples per eval prompt for sampled pass@1 (0 = greedy pass@1 only)",
    )
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument(
        "--keep-checkpoints", type=int, default=2,
        help="newest checkpoints kept (0 = all); the warm start step_000000 is always kept besides",
    )  # fmt: skip
    p.add_argument("--executor", default="inprocess", choices=EXECUTORS)
    p.add_argument("--update-mode", default="keep", choices=UPDATE_MODES)
    p.add_argument("--wandb", action="store_true", help="log to wandb in offline mode")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..integrations.megatron import MegatronUnavailableError
    from ..integrations.vllm import VllmUnavailableError
    from ..io import check_directory_path
    from ..rl import RLConfig, train
    from ..train.checkpoint import CheckpointError
    from .numerics import resolve_numerics

    try:
        check_directory_path(args.out, "--out")  # before any work, not when the run first writes
        numerics = resolve_numerics(args, args.kernels, args.rollout_kernels)
        config = RLConfig(
            env=args.env, model=args.model, algo=args.algo, **numerics, trainer=args.trainer,
            rollout_engine=args.rollout_engine, lag=args.lag,
            steps=args.steps,
            seed=args.seed,
            prompts_per_step=args.prompts_per_step, group_size=args.group_size,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, lr=args.lr, sft_steps=args.sft_steps, warm_start=args.warm_start,
            sft_seed=args.sft_seed, eval_every=args.eval_every,
            eval_size=args.eval_size, eval_samples=args.eval_samples, checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints, executor=args.executor, update_mode=args.update_mode,
            wandb=args.wandb,
        )  # fmt: skip
        summary = train(config, args.out, resume=args.resume, quiet=args.quiet)
    # FileExistsError (--out holds a run) is an OSError; CheckpointError a RuntimeError
    except (CheckpointError, OSError, ValueError, NotImplementedError, MegatronUnavailableError,
            VllmUnavailableError) as err:  # fmt: skip
        print(f"zm train: {_one_line(err, args.out)}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def _one_line(err: BaseException, out: str) -> str:
    """``err`` as one line naming its file: an OSError raised without a file name (a low-level write)
    is placed under --out; messages that span lines (a remote traceback) are joined."""
    from ..io import DirectoryLockedError

    text = str(err)
    if isinstance(err, OSError) and err.strerror and not isinstance(err, DirectoryLockedError):
        text = f"{err.filename}: {err.strerror}" if err.filename else f"--out {out}: {err.strerror}"
    return " ".join(text.split())
