"""Trainer forward + backward tokens/s: aligned-native ÷ fast-native, side by side in one run.

The learner's work on one packed batch of episodes: a trainer-mode forward of every sequence,
fp32 logits, the sampled tokens' log-softmax, and the backward of their sum into every weight.
Both kernel sets run on the same weights and tokens; each repetition alternates which goes
first (ABAB), and the reported ratio is the ratio of the per-set medians. aligned-native's
backward is the pure-torch aligned op's gradient recomputed (kernels/native/_autograd.py);
fast-native's is stock torch autograd over stock ops (kernels/fast_native.py). The compass:
TorchTitan's bitwise path runs forward/backward at 1/2.9 of its fast path.

Usage: ``python benchmarks/trainer_step.py [--model tiny-qwen3] [--dtype fp32] [--seqs 32]
[--seq-len 144] [--repeats 5] [--threads 1] [--quiet] [--out FILE.json]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from zeromismatch._provenance import provenance
from zeromismatch.argtypes import check_out_or_exit, int_at_least
from zeromismatch.engine.llm import build_preset
from zeromismatch.io import atomic_write_json
from zeromismatch.models import ForwardBatch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SETS = ("aligned-native", "fast-native")


def step_seconds(model, kernels: str, seqs: list[torch.Tensor]) -> float:
    model.set_kernels(kernels)
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    hidden = model(ForwardBatch.for_training(seqs), None)
    logits = model.compute_logits(hidden)
    targets = torch.cat([torch.roll(s, -1) for s in seqs])  # each row's next token (the last wraps)
    picked = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])
    picked.sum().backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--seqs", type=int_at_least(1), default=32)
    parser.add_argument("--seq-len", type=int_at_least(2), default=144)
    parser.add_argument("--repeats", type=int_at_least(1), default=5)
    parser.add_argument("--threads", type=int_at_least(1), default=1)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)
    from zeromismatch.models.presets import PRESETS

    if args.model not in PRESETS:
        parser.error(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")
    torch.set_num_threads(args.threads)
    model = build_preset(args.model, "aligned", DTYPES[args.dtype], 0)
    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    seqs = [torch.randint(0, vocab, (args.seq_len,), generator=gen) for _ in range(args.seqs)]
    for kernels in SETS:  # warm-up: the native build, packed weights, allocator
        step_seconds(model, kernels, seqs[:2])
    runs: dict[str, list[float]] = {k: [] for k in SETS}
    for rep in range(args.repeats):
        for kernels in SETS if rep % 2 == 0 else SETS[::-1]:
            seconds = step_seconds(model, kernels, seqs)
            runs[kernels].append(seconds)
            if not args.quiet:
                print(f"rep {rep} {kernels:15s} {seconds:.3f} s")
    tokens = args.seqs * args.seq_len
    medians = {k: tokens / statistics.median(v) for k, v in runs.items()}
    result = {
        "benchmark": "trainer_step",
        "config": vars(args),
        "tokens_per_step": tokens,
        "runs_seconds": runs,
        "median_tokens_per_s": medians,
        "ratio_aligned_native_over_fast_native": medians["aligned-native"] / medians["fast-native"],
        "target": 0.90,
        "provenance": provenance(config=vars(args)),
    }
    if args.out:
        atomic_write_json(Path(args.out), result)
    print({k: v for k, v in result.items() if k.startswith("ratio") or k == "median_tokens_per_s"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
