"""What a run directory contributes: runs still being written are skipped, steps recorded as null or
missing fail "exactly 0 at every step", and two-arm verdicts carry both arms' provenance."""

from __future__ import annotations

import json

from audit_helpers import deepseek_records, write_run

from zeromismatch.audit.figures import _curve_sources
from zeromismatch.audit.registry import load_registry
from zeromismatch.audit.report import _provenance_line
from zeromismatch.audit.runs import all_runs
from zeromismatch.audit.verdicts import NOT_REPRODUCED, NOT_RUN, REPRODUCED_EXACT, evaluate_all

EXP = "deepseek_v4_flash_100steps"
LAG = "reinforce_zero_lag64"
KERNEL = "S3-kernel-mismatch-survives-is"


def _verdicts(results, experiment):
    return {v.claim_id: v for v in evaluate_all(load_registry(results), results, experiment)}


def test_partial_runs_are_not_judged_or_drawn(results):
    # an in-progress run of the one-directory layout (arm-prefixed keys) and in-progress arm dirs
    write_run(results, EXP, "mini", ".2026-03-01.partial", records=deepseek_records(120))
    write_run(results, EXP, "mini", "run-a/.aligned.partial", records=deepseek_records(120))
    runs = all_runs(results, EXP)
    assert runs == []
    assert _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"].verdict == NOT_RUN
    write_run(results, EXP, "mini", "run-b", records=deepseek_records(120))
    runs = all_runs(results, EXP)
    assert [run.rel for run in runs] == [f"reproduced/{EXP}/mini/run-b/", f"reproduced/{EXP}/mini/"]
    assert list(runs[1].arms) == ["run-b"]
    assert [label for label, _ in _curve_sources(runs)["mini"]] == ["run-b"]


def _per_arm(results, aligned_records, summary=None):
    for arm in ("aligned", "default"):
        records = aligned_records if arm == "aligned" else [
            {"step": s, "gap_kernel_abs_max": 1e-4} for s in range(len(aligned_records))
        ]  # fmt: skip
        write_run(results, LAG, "mini", arm, records=records, summary=summary if arm == "aligned" else None)


def test_null_steps_fail_exactly_zero_at_every_step(results):
    records = [{"step": s, "gap_kernel_abs_max": 0.0} for s in range(100)]
    _per_arm(results, records)
    assert _verdicts(results, LAG)[KERNEL].verdict == REPRODUCED_EXACT  # the premise
    for record in records[1:]:
        record["gap_kernel_abs_max"] = None  # the reviewer's case: only step 0 recorded a value
    _per_arm(results, records)
    verdict = _verdicts(results, LAG)[KERNEL]
    assert verdict.verdict == NOT_REPRODUCED
    assert "over 1 steps; 0 steps nonzero; 99 steps recorded null or missing" in verdict.reason


def test_missing_keys_and_truncated_series_fail_too(results):
    records = [{"step": s, "gap_kernel_abs_max": 0.0} for s in range(100)]
    del records[40]["gap_kernel_abs_max"]
    _per_arm(results, records)
    assert "1 steps recorded null or missing" in _verdicts(results, LAG)[KERNEL].reason
    records = [{"step": s, "gap_kernel_abs_max": 0.0} for s in range(60)]
    _per_arm(results, records, summary={"steps": 100})  # metrics.jsonl holds 60 of the run's 100 steps
    verdict = _verdicts(results, LAG)[KERNEL]
    assert verdict.verdict == NOT_REPRODUCED and "40 steps recorded null or missing" in verdict.reason


def test_prefixed_layout_counts_null_steps_of_that_arm(results):
    records = deepseek_records(120)
    records[7]["aligned.diff_max"] = None
    write_run(results, EXP, "mini", "run-a", records=records)
    verdict = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert verdict.verdict == NOT_REPRODUCED
    assert "aligned.diff_max (all) not zero at every step" in verdict.reason
    assert "1 steps recorded null or missing" in verdict.reason


def test_two_arm_verdict_shows_each_arms_provenance(results):
    records = deepseek_records(120)
    for arm in ("aligned", "default"):
        unprefixed = [
            {"step": r["step"], **{k.split(".", 1)[1]: v for k, v in r.items() if k.startswith(arm + ".")}}
            for r in records
        ]
        write_run(results, EXP, "mini", arm, records=unprefixed)
    prov = json.loads((results / "reproduced" / EXP / "mini" / "aligned" / "provenance.json").read_text())
    prov["git_commit"] = "0123456789abcdef0123456789abcdef01234567-dirty"
    (results / "reproduced" / EXP / "mini" / "aligned" / "provenance.json").write_text(json.dumps(prov))
    (results / "reproduced" / EXP / "mini" / "default" / "provenance.json").unlink()
    verdict = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert verdict.verdict == REPRODUCED_EXACT and verdict.run == f"reproduced/{EXP}/mini/"
    assert verdict.arm_provenance == [
        {
            "data": f"reproduced/{EXP}/mini/aligned/",
            "git_commit": "0123456789abcdef0123456789abcdef01234567-dirty",
            "config_hash": "feedfacecafebeef",
        },
        {"data": f"reproduced/{EXP}/mini/default/", "missing": True},
    ]
    line = _provenance_line(verdict)
    assert (
        "(per arm: aligned/ git 0123456789ab-dirty, config feedfacecafebeef; default/ no provenance.json)"
        in line
    )


def test_a_metric_divided_by_a_key_is_a_per_record_ratio(results):
    """``a+b/c``: per record (a + b) / c, e.g. a step time per token; a record whose divisor is 0 or
    absent has no value (it is skipped, never counted as 0 or infinity)."""
    from zeromismatch.audit.runs import DataDir, metric_series

    records = [
        {"step": 0, "time_rollout_s": 1.0, "time_learner_s": 1.0, "tokens": 4},
        {"step": 1, "time_rollout_s": 2.0, "time_learner_s": 1.0, "tokens": 0},
        {"step": 2, "time_rollout_s": 3.0, "time_learner_s": 3.0},
        {"step": 3, "time_rollout_s": 0.5, "time_learner_s": 0.5, "tokens": 8},
    ]
    run = write_run(results, "osworld_step_time", "mini", "aligned", records=records)
    series = metric_series(DataDir(results, run), "time_rollout_s+time_learner_s/tokens", None, False)
    assert series == [(0, 0.5), (3, 0.125)]
    assert metric_series(DataDir(results, run), "time_rollout_s+time_learner_s", None, False)[2] == (2, 6.0)


def test_window_steps_reads_a_rolling_mean_of_that_many_steps_at_either_end(results):
    """``window_steps`` k: head_mean / tail_mean over the first / last k steps (S1's "5-step rolling
    mean" read at the start and the end of training), whatever the run's length; the fraction
    ``window`` (default 10%) otherwise."""
    from zeromismatch.audit.runs import DataDir, _resolve_metric

    records = [{"step": s, "solved_rate": float(s)} for s in range(40)]
    run = write_run(results, "nemotron_nvfp4_swebench", "mini", "fast", records=records)
    places = [(DataDir(results, run), False)]

    def read(**operand):
        return _resolve_metric({"metric": "solved_rate", **operand}, places, "x", "here")

    head, tail = read(agg="head_mean", window_steps=5), read(agg="tail_mean", window_steps=5)
    assert (head.value, tail.value) == (2.0, 37.0) and head.samples == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert "tail_mean of 5 of 40 steps" in tail.source
    assert read(agg="head_mean").value == 1.5  # 10% of 40 steps: 4
    assert read(agg="tail_mean", window_steps=400).value == 19.5  # longer than the run: all of it
