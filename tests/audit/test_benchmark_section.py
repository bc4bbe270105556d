"""The report's benchmark section renders exactly what the benchmark files hold."""

from __future__ import annotations

import json
import math

import pytest
from audit_helpers import write_benchmark

from zeromismatch.audit.benchmarks import PRESET_ROLLOUTS, benchmark_lines, lines_to_html
from zeromismatch.audit.registry import AuditInputError


def test_no_benchmark_files_only_not_run_lines(tmp_path):
    # each absent file is a "not run" line (tests/audit/test_not_run_gaps.py), never a table
    lines = benchmark_lines(tmp_path)
    assert not any(line.startswith(("|", "###")) for line in lines)
    # ops, rollout, async, vllm_peer, the other presets' rollouts, every preset's step breakdown
    assert sum(line.startswith("- not run:") for line in lines) == 4 + 2 * len(PRESET_ROLLOUTS) + 1


def test_ops_geomean_and_worst_come_from_the_cases(tmp_path):
    cases = [
        {"op": "linear", "shape": "M=1", "throughput_ratio": 0.5},
        {"op": "linear", "shape": "M=16", "throughput_ratio": 2.0},
        {"op": "silu_mul", "shape": "M=4", "throughput_ratio": 0.8},
    ]
    commit = "0123456789abcdef0123456789abcdef01234567-dirty"
    write_benchmark(tmp_path, "ops", {"cases": cases, "threads": 1, "provenance": {"git_commit": commit}})
    text = "\n".join(benchmark_lines(tmp_path))
    # the column says what it tests (the geomean), the per-shape target gets its own count
    assert "| op | shapes | geomean | worst | worst shape | shapes below 0.9 | geomean ≥ 0.9 |" in text
    assert f"| linear | 2 | {math.sqrt(0.5 * 2.0):.2f} | 0.50 | M=1 | 1 | yes |" in text
    assert "| silu_mul | 1 | 0.80 | 0.80 | M=4 | 1 | no |" in text
    assert "(`reproduced/benchmarks/ops.json`, 1 thread(s), git 0123456789ab-dirty)" in text


def test_per_kernel_set_summary_swaps_in_the_native_rows(tmp_path):
    """The aligned-native set is read as the plain rows with each ``<op>_native`` row in place of
    ``<op>``; the aligned set as the plain rows alone."""
    cases = [
        {"op": "linear", "shape": "M=1", "throughput_ratio": 0.5},
        {"op": "linear", "shape": "M=16", "throughput_ratio": 0.6},
        {"op": "rms_norm", "shape": "M=1", "throughput_ratio": 0.95},
        {"op": "linear_native", "shape": "M=1", "throughput_ratio": 0.8},
        {"op": "linear_native", "shape": "M=16", "throughput_ratio": 1.25},
    ]
    write_benchmark(tmp_path, "ops", {"cases": cases, "threads": 1})
    text = "\n".join(benchmark_lines(tmp_path))
    assert "- `aligned` set: 1 of 2 ops at geomean ≥ 0.9 (below: linear 0.55); 1 of 3 shapes ≥ 0.9." in text
    assert "- `aligned-native` set: 2 of 2 ops at geomean ≥ 0.9 (below: none); 2 of 3 shapes ≥ 0.9." in text
    # without native rows there is no per-set summary
    write_benchmark(tmp_path, "ops", {"cases": cases[:3], "threads": 1})
    assert "Per kernel set" not in "\n".join(benchmark_lines(tmp_path))


def test_rollout_async_and_vllm_peer_tables(tmp_path):
    write_benchmark(
        tmp_path,
        "rollout",
        {
            "median_tokens_per_s": {"engine-aligned": 900.0, "engine-default": 1000.0, "hf-generate": 300.0},
            "ratio_aligned_over_default": 0.9,
            "ratio_engine_aligned_over_hf": 3.0,
            "provenance": {"git_commit": "abcdef0123456789"},
        },
    )
    write_benchmark(
        tmp_path,
        "async",
        {"async_over_sync": 1.5, "lag": 4, "ideal_over_sync": 1.8,
         "sync_step_median_s": {"rollout": 0.02, "learner": 0.025}},
    )  # fmt: skip
    stats = {"tokens": 10, "tokens_differing": 3, "diff_max": 1e-6, "diff_mean": 2e-7, "k3_kl": 4e-14}
    write_benchmark(
        tmp_path,
        "vllm_peer",
        {
            "vllm_version": "0.32.0",
            "median_tokens_per_s": {"vllm": 2000.0, "engine-aligned": 1000.0},
            "ratio_engine_aligned_over_vllm": 0.5,
            "mismatch": {
                "vllm_vs_trainer_aligned": {**stats, "identical": False},
                "engine_aligned_vs_trainer_aligned": {
                    **stats, "tokens_differing": 0, "diff_max": 0.0, "diff_mean": 0.0, "k3_kl": 0.0,
                    "identical": True,
                },
            },
        },
    )  # fmt: skip
    lines = benchmark_lines(tmp_path)
    text = "\n".join(lines)
    assert "| engine aligned ÷ default | 0.90 | 0.95 |" in text and "git abcdef012345" in text
    assert "| engine aligned ÷ HF `generate` | 3.00 | 3.0 |" in text
    assert "Measured 1.50× at lag 4" in text and "20 ms rollout, 25 ms learner): 1.80×" in text
    assert "| vllm vs trainer aligned | 10 | 3 | 1e-06 |" in text
    assert "| engine aligned vs trainer aligned | 10 | 0 | 0 | 0 | 0 | True |" in text
    html = lines_to_html(lines)
    assert "<td>engine aligned ÷ HF <code>generate</code></td><td>3.00</td>" in html
    assert "|" not in html


def test_malformed_benchmark_file_is_one_error_naming_it(tmp_path):
    path = write_benchmark(tmp_path, "rollout", {})
    path.write_text("{not json")
    with pytest.raises(AuditInputError, match="malformed benchmark file .*rollout.json: invalid JSON"):
        benchmark_lines(tmp_path)


STATED = "0123456789abcdef0123456789abcdef01234567"
LOCAL = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.mark.parametrize(
    ("recorded", "shown"),
    [
        (f"{STATED}-dirty", "git 0123456789ab-dirty"),
        (
            f"{STATED} (stated by ZEROMISMATCH_GIT_COMMIT; local git: {LOCAL}-dirty)",
            "git 0123456789ab (stated by ZEROMISMATCH_GIT_COMMIT; local git: fedcba987654-dirty)",
        ),
        ("unknown", "git unknown"),
    ],
)
def test_commit_is_shortened_but_its_suffixes_are_kept(tmp_path, recorded, shown):
    write_benchmark(tmp_path, "async", {"async_over_sync": 1.5, "provenance": {"git_commit": recorded}})
    assert f"(`reproduced/benchmarks/async.json`, {shown})" in "\n".join(benchmark_lines(tmp_path))


def test_rollout_ratios_per_preset_table(tmp_path):
    ratios = {"ratio_aligned_over_default": 0.5, "ratio_aligned_native_over_default": 1.1,
              "ratio_aligned_native_over_fast_native": 0.97}  # fmt: skip
    write_benchmark(tmp_path, "rollout", ratios)
    write_benchmark(tmp_path, f"rollout_{PRESET_ROLLOUTS[0]}", {"ratio_aligned_over_default": 0.6})
    text = "\n".join(benchmark_lines(tmp_path))
    assert "| tiny-qwen3 | `rollout.json` | 0.97 | 0.50 | 1.10 | - | - |" in text
    assert f"| {PRESET_ROLLOUTS[0]} | `rollout_{PRESET_ROLLOUTS[0]}.json` | - | 0.60 | - | - | - |" in text
    assert f"not run: `reproduced/benchmarks/rollout_{PRESET_ROLLOUTS[1]}.json`" in text


def test_rollout_breakdown_table_reads_the_budget_and_the_c_time(tmp_path):
    phases = {"schedule": 0.05, "build_batch": 0.08, "forward": 1.3, "logits": 0.07, "sampler": 0.19,
              "bookkeeping": 0.12}  # fmt: skip
    native = {**dict.fromkeys(phases, 0.0), "forward": 0.63, "logits": 0.04, "sampler": 0.01}
    write_benchmark(
        tmp_path,
        "rollout_breakdown",
        {
            "ratio_engine_over_hf": 1.59,
            "engine_ms_per_step": 1.809,
            "budget_ms_per_step": 0.956,
            "native_ms_per_step": 0.68,
            "outside_native_ms_per_step": 1.13,
            "phase_ms_per_step": phases,
            "native_ms_per_step_by_phase": native,
        },
    )
    text = "\n".join(benchmark_lines(tmp_path))
    # forward outside C: 1.3 - 0.63; left for it: 0.956 - 0.68 - (1.13 - 0.67)
    row = "| tiny-qwen3 | `rollout_breakdown.json` | 1.59 | - | - | 1.809 | 0.956 | 0.680 | 1.130 | 0.276 "
    row += "| 0.670 | -0.184 |"
    assert row in text  # (a file from before step graphs: no eager engine columns)
    assert "| tiny-qwen3 | 0.050 (0.000) | 0.080 (0.000) | 1.300 (0.630) | 0.070 (0.040) |" in text
    assert f"not run: `reproduced/benchmarks/rollout_breakdown_{PRESET_ROLLOUTS[0]}.json`" in text
    path = tmp_path / "reproduced" / "benchmarks" / "rollout_breakdown.json"
    eager = {"ratio_engine_eager_over_hf": 1.1, "ratio_step_graphs_over_eager": 1.445}
    write_benchmark(tmp_path, "rollout_breakdown", {**json.loads(path.read_text()), **eager})
    row = "| tiny-qwen3 | `rollout_breakdown.json` | 1.59 | 1.10 | 1.45 | 1.809 |"
    assert row in "\n".join(benchmark_lines(tmp_path))
    # a file without the budget is one error naming the file and the key
    write_benchmark(tmp_path, "rollout_breakdown", {"ratio_engine_over_hf": 1.59})
    with pytest.raises(AuditInputError, match="rollout_breakdown.json"):
        benchmark_lines(tmp_path)
