"""The cost of alignment, like for like: rollout tokens/s of aligned-native ÷ fast-native over a grid.

Both sides are ``zeromismatch.engine.LLM`` with the same engine features (continuous batching,
every prompt admitted at once, decode step graphs, no prefix caching) on the same weights and
prompts; they differ only in the kernel set: ``aligned-native`` (the aligned arm's fixed-order C
kernels, kernels/native) and ``fast-native`` (the unaligned baseline of equal effort,
kernels/fast_native.py: the fastest op per call, batch-variant). Each cell times the two
``--repeats`` times (more for short runs: each set at least 2.5 s in all) in rotating order (ABAB)
and reports the ratio of the per-set medians, of wall-clock tokens/s and of tokens per process
CPU second.

The grid (``--cells tiny``): every tiny preset x ``--threads`` x ``--batches`` x two workloads,
``decode`` (16-token prompts, 256 new) and ``prefill`` (512-token prompts, 16 new), x three
formats: ``fp32``, ``bf16``, and ``bf16-fp8`` (bf16 activations, FP8 weights on both sides, the
rollout format of the published fast stack). ``--cells mid`` adds the GEMM-bound regime: the
Qwen3-0.6B-shaped preset, random init, bf16, batch 8, 16-token prompts, 16 new, with its achieved
linear-layer FLOP/s against this CPU's measured peak (the median of big ``torch.matmul`` calls in
the same dtype and thread count; attention scores are left out of the FLOPs, < 1% at 32 positions).

The file is rewritten (atomically) after every cell, ``complete`` false until the last;
``--resume`` keeps the cells of an earlier file with the same grid and commit, so an interrupted
run goes on where it stopped. ``summary`` (``audit.alignment_cost.grid_summary``, as the report
computes it) names the worst cell and the batch-32 cells below the issue's target of 0.95.

Usage: ``python benchmarks/alignment_cost.py [--cells tiny mid] [--presets ...] [--threads 1 2]
[--batches 1 8 32 64] [--formats fp32 bf16 bf16-fp8] [--workloads decode prefill] [--repeats 5]
[--resume] [--quiet] [--out results/reproduced/benchmarks/alignment_cost.json]``
(about 30 minutes for the whole grid on two cores; run it on a quiet machine: at 2 threads on 2 cores
anything else running stalls the runs several-fold)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import WARM_UP_TOKENS, make_prompts, run_rotating, time_engine  # noqa: E402

from zeromismatch._provenance import freeze_git_state, git_commit, provenance  # noqa: E402
from zeromismatch.argtypes import check_out_or_exit, int_at_least  # noqa: E402
from zeromismatch.audit.alignment_cost import grid_summary  # noqa: E402
from zeromismatch.engine.llm import build_preset  # noqa: E402
from zeromismatch.io import atomic_write_json  # noqa: E402
from zeromismatch.kernels.native import unavailable_reason as native_unavailable_reason  # noqa: E402

SETS = ("aligned-native", "fast-native")
TINY_PRESETS = ("tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h")
#: format name -> (activation dtype, weight format on both sides)
FORMATS = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, None), "bf16-fp8": (torch.bfloat16, "fp8")}
#: workload name -> (prompt tokens, new tokens)
WORKLOADS = {"decode": (16, 256), "prefill": (512, 16)}
MID_PRESET, MID_FORMAT, MID_BATCH, MID_WORKLOAD = "qwen3-0.6b", "bf16", 8, ("mid", 16, 16)
MIN_SECONDS, MAX_REPEATS = 2.5, 21


def cell_key(cell: dict) -> tuple:
    return (cell["preset"], cell["format"], cell["threads"], cell["batch"], cell["workload"])


def linear_flops_per_token(model) -> int:
    """2 x the weights a token multiplies in a dense model: each 2-D weight outside the embedding,
    plus the lm_head when it is the tied embedding."""
    total = sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n)
    if getattr(model.config, "tie_word_embeddings", False):
        total += model.lm_head_weight.numel()
    return 2 * total


def peak_matmul_flops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """This CPU's matmul FLOP/s in ``dtype`` at the current thread count: median of big square
    ``torch.matmul`` calls (MKL / oneDNN), the practical peak a GEMM-bound rollout could reach."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(seconds)


def measure_cell(model, preset, fmt, threads, batch, workload, repeats, seed, quiet) -> dict:
    name, prompt_len, new_tokens = workload
    torch.set_num_threads(threads)
    prompts = make_prompts(batch, prompt_len, int(model.config.vocab_size), seed)

    def timer(kernels: str):
        def run():
            timing = time_engine(model, kernels, prompts, new_tokens, 1.0)
            model.set_kernels("aligned")
            return timing

        return run

    timers = {f"engine-{k}": timer(k) for k in SETS}
    # one untimed run per set sizes the repeats: a cell of 0.1 s runs gets enough of them that each
    # set is timed for MIN_SECONDS in all (medians of 3 runs that short move by ~10%)
    probe = max(timers[name]()[0] for name in timers)
    repeats = min(MAX_REPEATS, max(repeats, math.ceil(MIN_SECONDS / probe)))
    runs, medians, cpu_medians = run_rotating(timers, repeats, quiet)
    aligned, fast = medians["engine-aligned-native"], medians["engine-fast-native"]
    cell = {
        "preset": preset,
        "format": fmt,
        "threads": threads,
        "batch": batch,
        "workload": name,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "median_tokens_per_s": medians,
        "median_tokens_per_cpu_s": cpu_medians,
        "ratio_aligned_native_over_fast_native": aligned / fast,
        "ratio_aligned_native_over_fast_native_cpu": (
            cpu_medians["engine-aligned-native"] / cpu_medians["engine-fast-native"]
        ),
        "runs_seconds": {k: [r["seconds"] for r in v] for k, v in runs.items()},
        "step_graphs": {k: v[-1]["step_graphs"] for k, v in runs.items()},
    }
    if name == "mid":
        per_token = linear_flops_per_token(model)
        processed = batch * (prompt_len + new_tokens)
        cell["linear_flops_per_token"] = per_token
        cell["achieved_flops_per_s"] = {
            k: per_token * processed / statistics.median(s) for k, s in cell["runs_seconds"].items()
        }
        cell["peak_matmul_flops_per_s"] = peak_matmul_flops(model.dtype)
        cell["fraction_of_peak"] = {
            k: v / cell["peak_matmul_flops_per_s"] for k, v in cell["achieved_flops_per_s"].items()
        }
    return cell


def plan(args) -> list[tuple[str, str, int, int, tuple]]:
    cells = []
    if "tiny" in args.cells:
        for preset, fmt in itertools.product(args.presets, args.formats):
            for threads, batch, work in itertools.product(args.threads, args.batches, args.workloads):
                cells.append((preset, fmt, threads, batch, (work, *WORKLOADS[work])))
    if "mid" in args.cells:
        cells += [(MID_PRESET, MID_FORMAT, threads, MID_BATCH, MID_WORKLOAD) for threads in args.threads]
    return cells


def earlier_cells(path: Path, grid: dict) -> list[dict]:
    """The cells of an earlier file measured on the same grid at the same commit (``--resume``)."""
    if not path.is_file():
        return []
    try:
        earlier = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    same = earlier.get("grid") == grid and earlier.get("provenance", {}).get("git_commit") == git_commit()
    return list(earlier.get("cells", [])) if same else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", choices=("tiny", "mid"), default=["tiny", "mid"])
    parser.add_argument("--presets", nargs="+", choices=TINY_PRESETS, default=list(TINY_PRESETS))
    parser.add_argument("--threads", nargs="+", type=int_at_least(1), default=[1, 2])
    parser.add_argument("--batches", nargs="+", type=int_at_least(1), default=[1, 8, 32, 64])
    parser.add_argument("--formats", nargs="+", choices=sorted(FORMATS), default=list(FORMATS))
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int_at_least(1), default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="keep an earlier --out file's cells")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition lines")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)
    freeze_git_state()  # the code that runs is the code imported now, whatever the checkout holds later
    not_run = native_unavailable_reason()
    if not_run:
        print(f"alignment_cost.py: the native kernel sets cannot run: {not_run}", file=sys.stderr)
        return 2
    grid = {k: getattr(args, k) for k in ("cells", "presets", "threads", "batches", "formats", "workloads")}
    grid.update(repeats=args.repeats, seed=args.seed)
    out = Path(args.out) if args.out else None
    cells = earlier_cells(out, grid) if (out and args.resume) else []
    done = {cell_key(c) for c in cells}
    todo = [p for p in plan(args) if (p[0], p[1], p[2], p[3], p[4][0]) not in done]
    model_key, model = None, None
    for preset, fmt, threads, batch, workload in tqdm(todo, desc="cells", disable=args.quiet):
        dtype, quant = FORMATS[fmt]
        if model_key != (preset, fmt):
            model_key, model = (preset, fmt), build_preset(preset, "aligned", dtype, args.seed, quant)
            for kernels in SETS:  # untimed: the native library's build, dynamo's import, lazy inits
                warm = make_prompts(2, 4, int(model.config.vocab_size), args.seed)
                time_engine(model, kernels, warm, WARM_UP_TOKENS, 1.0)
        cells.append(
            measure_cell(model, preset, fmt, threads, batch, workload, args.repeats, args.seed, True)
        )
        if not args.quiet:
            c = cells[-1]
            tqdm.write(f"{preset} {fmt} t{threads} b{batch} {workload[0]}: "
                       f"{c['ratio_aligned_native_over_fast_native']:.3f}")  # fmt: skip
        if out:
            atomic_write_json(out, result(grid, cells, complete=False))
    final = result(grid, cells, complete=True)
    if out:
        atomic_write_json(out, final)
    print(json.dumps(final["summary"], indent=1))
    return 0


def result(grid: dict, cells: list[dict], complete: bool) -> dict:
    return {
        "benchmark": "alignment_cost",
        "grid": grid,
        "complete": complete,
        "cells": cells,
        "summary": grid_summary(cells),
        "provenance": provenance(config=grid),
    }


if __name__ == "__main__":
    sys.exit(main())
