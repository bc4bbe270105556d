"""The report's cost-of-alignment section renders what the benchmark files hold: the judged pair,
the grid's worst cell and its batch table, the GEMM-bound cell, the learner; absent files are
"not run" lines with their command; a malformed file is one AuditInputError naming the key."""

from __future__ import annotations

import json

import pytest
from audit_helpers import PUBLISHED, write_benchmark

from zeromismatch.audit.alignment_cost import alignment_cost_lines
from zeromismatch.audit.benchmark_suite import FP8_ROLLOUT
from zeromismatch.audit.registry import AuditInputError, load_registry

SYSTEMS = ("engine-aligned-native", "engine-fast-native")
#: today's claims: which of them read this pair (S1, S3) is the registry's to say, not the section's
TODAY = load_registry(PUBLISHED.parent)


def cell(preset, fmt, batch, ratio, workload="decode", threads=1, **extra):
    return {
        "preset": preset,
        "format": fmt,
        "threads": threads,
        "batch": batch,
        "workload": workload,
        "ratio_aligned_native_over_fast_native": ratio,
        "ratio_aligned_native_over_fast_native_cpu": ratio * 1.01,
        **extra,
    }


def grid(cells, complete=True):
    return {"cells": cells, "complete": complete}


def test_absent_files_are_not_run_lines_with_their_commands(results):
    text = "\n".join(alignment_cost_lines(results, TODAY))
    for name in ("rollout_tiny-deepseek-v3.json", FP8_ROLLOUT, "alignment_cost.json", "trainer_step.json"):
        assert f"- not run: `reproduced/benchmarks/{name}` (run: `python benchmarks/" in text
    assert "--quant fp8-block" in text  # S3's file names its format in its command
    # the anchors are published context, shown whatever was run, each with its source
    assert "34.35 %" in text and "lmsys.org/blog/2025-09-22-sglang-deterministic" in text
    assert "(unverified)" in text


def test_grid_worst_cell_batch_table_and_mid_cell(results):
    mid = cell(
        "qwen3-0.6b",
        "bf16",
        8,
        0.93,
        workload="mid",
        achieved_flops_per_s=dict(zip(SYSTEMS, (1.2e11, 1.3e11), strict=True)),
        fraction_of_peak=dict(zip(SYSTEMS, (0.6, 0.65), strict=True)),
        peak_matmul_flops_per_s=2e11,
    )
    cells = [cell("tiny-qwen3", "fp32", 8, 1.10), cell("tiny-qwen3", "fp32", 32, 0.90), mid]
    write_benchmark(results, "alignment_cost", {**grid(cells), "provenance": {"git_commit": "a" * 40}})
    text = "\n".join(alignment_cost_lines(results, TODAY))
    assert "2 cells; geometric mean 0.995; worst 0.900 (CPU-time ratio 0.909)" in text
    assert "at tiny-qwen3 fp32 decode batch 32 1 thread(s)" in text
    assert "0 of 1 batch-32 cells meet it (below: tiny-qwen3 fp32 decode batch 32 1 thread(s) 0.900)" in text
    assert "| tiny-qwen3 | fp32 | decode | 1 | 1.100 | 0.900 |" in text
    assert "| qwen3-0.6b | bf16 | 8 | 1 | 0.930 | 120.0 | 130.0 | 200.0 | 60 | 65 |" in text


def test_judged_pair_rows_state_the_workload_and_the_published_threshold(results):
    config = {
        "dtype": "bf16",
        "quant": "fp8-block",
        "batch": 32,
        "prompt_len": 16,
        "new_tokens": 128,
        "threads": 1,
    }
    data = {
        "config": config,
        "median_tokens_per_s": dict(zip(SYSTEMS, (900.0, 1000.0), strict=True)),
        "ratio_aligned_native_over_fast_native": 0.9,
    }
    write_benchmark(results, FP8_ROLLOUT.removesuffix(".json"), data)
    text = "\n".join(alignment_cost_lines(results, TODAY))
    assert (
        "bf16, fp8-block weights, batch 32, 16-token prompts, 128 new, 1 thread(s) "
        "| 900 | 1000 | 0.900 | ≥ 0.9 |" in text
    )


def test_an_incomplete_grid_says_so_and_a_malformed_one_names_the_key(results):
    write_benchmark(results, "alignment_cost", grid([cell("tiny-qwen3", "bf16", 32, 0.97)], complete=False))
    assert "**incomplete**" in "\n".join(alignment_cost_lines(results, TODAY))
    broken = grid([{**cell("tiny-qwen3", "bf16", 32, 0.97), "ratio_aligned_native_over_fast_native": "fast"}])
    write_benchmark(results, "alignment_cost", broken)
    with pytest.raises(AuditInputError, match=r"cells\[0\]\.ratio_aligned_native_over_fast_native"):
        alignment_cost_lines(results, TODAY)


def test_the_committed_anchors_file_has_a_source_for_every_anchor(results):
    anchors = json.loads((results / "published" / "anchors" / "cost_of_alignment.json").read_text())[
        "anchors"
    ]
    assert anchors and all(a["source"] and (a["url"] or not a["verified"]) for a in anchors)


def test_rl_step_line_reads_both_arms(results):
    config = {"model": "tiny-qwen3", "dtype": "float32", "env": "arithmetic", "prompts": 8, "group_size": 4,
              "max_new_tokens": 32, "threads": 1}  # fmt: skip
    data = {
        "config": config,
        "arms": {"aligned": {"median_step_s": 0.2}, "fast": {"median_step_s": 0.18}},
        "ratio_aligned_over_fast_per_step": 0.9,
        "ratio_aligned_over_fast_per_token": 0.91,
        "ratio_aligned_over_fast_by_phase": {"time_rollout_s": 1.02, "time_learner_s": 0.8},
    }
    write_benchmark(results, "rl_step", data)
    text = "\n".join(alignment_cost_lines(results, TODAY))
    assert (
        "200.0 vs 180.0 ms per step; aligned ÷ fast throughput 0.900 per step, 0.910 per generated token"
        in text
    )
    assert "(rollout 1.020, learner 0.800)" in text
