"""Malformed benchmark / learnability / portability files: one AuditInputError naming the file and the
key path, never a raw KeyError or AttributeError; and a failed build leaves the old outputs alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from audit_helpers import deepseek_records, run_make_all, write_run

from zeromismatch.audit import AuditInputError, build_all
from zeromismatch.audit.benchmarks import benchmark_lines
from zeromismatch.audit.learnability import learnability_lines
from zeromismatch.audit.portability import portability_lines
from zeromismatch.audit.report import STAGING_PREFIX

GOOD = {
    "reproduced/benchmarks/ops.json": {
        "threads": 1,
        "cases": [{"op": "linear", "shape": "M=1", "throughput_ratio": 0.5}],
    },
    "reproduced/benchmarks/rollout.json": {
        "median_tokens_per_s": {"engine-aligned": 900.0, "engine-default": 1000.0},
        "ratio_aligned_over_default": 0.9,
    },
    "reproduced/benchmarks/async.json": {"async_over_sync": 1.5, "lag": 4},
    "reproduced/benchmarks/vllm_peer.json": {
        "median_tokens_per_s": {"vllm": 2.0, "engine-aligned": 1.0},
        "ratio_engine_aligned_over_vllm": 0.5,
        "mismatch": {
            "a_vs_b": {
                "tokens": 3,
                "tokens_differing": 0,
                "diff_max": 0.0,
                "diff_mean": 0.0,
                "k3_kl": 0.0,
                "identical": True,
            },
        },
    },
    "reproduced/learnability/tools/seed0/summary.json": {
        "eval_pass_at_1_before": 0.1,
        "eval_pass_at_1_after": 0.2,
        "eval_sampled_pass_at_1_before": 0.1,
        "eval_sampled_pass_at_1_after": 0.2,
        "reward_mean_first_fifth": 0.1,
        "reward_mean_last_fifth": 0.2,
        "k3_kl_max_over_steps": 0.0,
    },
    "reproduced/learnability/tools/seed0/config.json": {
        "env": "tools",
        "model": "tiny-qwen3",
        "lag": 0,
        "kernels": "aligned",
        "steps": 10,
        "seed": 0,
    },
    "reproduced/portability/invariance_x.json": {
        "runs": [
            {
                "kernels": "aligned",
                "device_name": "cpu",
                "torch_threads": 1,
                "torch": "2.x",
                "checks": [{"op": "linear", "prop": "rows", "dtype": "fp32", "identical": True}],
            },
        ],
    },
    "reproduced/portability/gemm_rows_x.json": {
        "findings": {"fp32 K=8 N=8 F.linear": {"bad_M": [], "bad_offsets": []}},
    },
}


def _set(doc, keys, value):
    for key in keys[:-1]:
        doc = doc[key]
    doc[keys[-1]] = value


def _drop(doc, keys):
    for key in keys[:-1]:
        doc = doc[key]
    del doc[keys[-1]]


# (file, mutation, what the message must name) -- the reviewer's seven cases first, then a few more
CASES = {
    "ops_missing_ratio": ("ops.json", lambda d: _drop(d, ["cases", 0, "throughput_ratio"]),
                          "cases[0].throughput_ratio is missing"),
    "rollout_tps_list": ("rollout.json", lambda d: _set(d, ["median_tokens_per_s"], [1, 2]),
                         "median_tokens_per_s should be a JSON object, is a list"),
    "async_missing_key": ("async.json", lambda d: _drop(d, ["async_over_sync"]),
                          "async_over_sync is missing"),
    "learn_summary_list": ("seed0/summary.json", None, "(top level) should be a JSON object, is a list"),
    "learn_config_noseed": ("seed0/config.json", lambda d: _drop(d, ["seed"]), "seed is missing"),
    "inv_run_nochecks": ("invariance_x.json", lambda d: _drop(d, ["runs", 0, "checks"]),
                         "runs[0].checks is missing"),
    "gemm_value_list": ("gemm_rows_x.json", lambda d: _set(d, ["findings", "fp32 K=8 N=8 F.linear"], []),
                        "findings.fp32 K=8 N=8 F.linear should be a JSON object, is a list"),
    "ops_zero_ratio": ("ops.json", lambda d: _set(d, ["cases", 0, "throughput_ratio"], 0),
                       "cases[0].throughput_ratio should be a finite number > 0"),
    "provenance_list": ("async.json", lambda d: _set(d, ["provenance"], ["abc"]),
                        "provenance should be a JSON object"),
    "vllm_stats_string": ("vllm_peer.json", lambda d: _set(d, ["mismatch", "a_vs_b", "diff_max"], "0"),
                          "mismatch.a_vs_b.diff_max should be a number, is string '0'"),
    "learn_lag_string": ("seed0/config.json", lambda d: _set(d, ["lag"], "8"), "lag should be an integer"),
    "inv_identical_string": ("invariance_x.json",
                             lambda d: _set(d, ["runs", 0, "checks", 0, "identical"], "yes"),
                             "runs[0].checks[0].identical should be true or false"),
}  # fmt: skip


def _write_inputs(root: Path, docs: dict) -> None:
    for rel, doc in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))


def _sections(root: Path) -> list[str]:
    return benchmark_lines(root) + learnability_lines(root) + portability_lines(root)


def test_the_well_formed_inputs_render(tmp_path):
    _write_inputs(tmp_path, GOOD)
    text = "\n".join(_sections(tmp_path))
    assert "| linear | 1 | 0.50 | 0.50 | M=1 | 1 | no |" in text and "| tools |" in text


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input_is_one_error_naming_file_and_key(tmp_path, case):
    suffix, mutate, expected = CASES[case]
    docs = copy.deepcopy(GOOD)
    rel = next(rel for rel in docs if rel.endswith(suffix))
    if mutate is None:
        docs[rel] = "[1, 2]"
    else:
        mutate(docs[rel])
    _write_inputs(tmp_path, docs)
    with pytest.raises(AuditInputError) as raised:
        _sections(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / rel) in message and expected in message, message


def _outputs(results: Path) -> dict[str, bytes]:
    names = ["REPORT.md", "report.html", "verdicts.json"]
    names += [f"figures/{p.name}" for p in sorted((results / "figures").glob("*.png"))]
    return {name: (results / name).read_bytes() for name in names}


def _no_staging_left(results: Path) -> bool:
    return not [p for p in results.iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_malformed_input_leaves_previous_outputs_untouched(results):
    run = write_run(results, "deepseek_v4_flash_100steps", "mini", "run-a", records=deepseek_records(120))
    _write_inputs(results, GOOD)
    build_all(results, quiet=True)
    before = _outputs(results)
    assert "figures/curves__deepseek_v4_flash_100steps__mini.png" in before
    # the next build would drop the run's curves and change the report -- had it got that far
    for path in run.iterdir():
        path.unlink()
    run.rmdir()
    docs = copy.deepcopy(GOOD)
    del docs["reproduced/benchmarks/ops.json"]["cases"][0]["throughput_ratio"]
    _write_inputs(results, docs)
    with pytest.raises(AuditInputError, match="ops.json: cases.0..throughput_ratio is missing"):
        build_all(results, quiet=True)
    assert _outputs(results) == before
    assert _no_staging_left(results)


@pytest.mark.slow
def test_failure_while_drawing_leaves_previous_outputs_untouched(results, monkeypatch):
    build_all(results, quiet=True)
    before = _outputs(results)
    # new data: the experiment figure and the report would change
    write_run(results, "deepseek_v4_flash_100steps", "mini", "run-a", records=deepseek_records(120))

    def broken(*args, **kwargs):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr("zeromismatch.audit.figures.throughput_ratios", broken)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        build_all(results, quiet=True)
    assert _outputs(results) == before
    assert _no_staging_left(results)
    monkeypatch.undo()
    build_all(results, quiet=True)  # and once it works, the new outputs replace the old ones
    after = _outputs(results)
    assert after["REPORT.md"] != before["REPORT.md"]
    assert "figures/curves__deepseek_v4_flash_100steps__mini.png" in after
    assert _no_staging_left(results)


def test_make_all_on_a_malformed_benchmark_is_one_message_and_changes_nothing(results):
    (results / "REPORT.md").write_text("previous report\n")
    docs = {"reproduced/benchmarks/rollout.json": {"median_tokens_per_s": [1, 2]}}
    _write_inputs(results, docs)
    out = run_make_all(results)
    assert out.returncode == 2
    assert "rollout.json: median_tokens_per_s should be a JSON object" in out.stderr
    assert "Traceback" not in out.stderr
    assert (results / "REPORT.md").read_text() == "previous report\n"
    assert not (results / "verdicts.json").exists() and not (results / "figures").exists()
    assert _no_staging_left(results)
