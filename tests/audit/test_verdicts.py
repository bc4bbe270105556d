"""Verdicts from synthetic run directories: all five verdicts, no invented values, --strict, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from audit_helpers import deepseek_records, seal_run, write_benchmark, write_run

from zeromismatch.audit.registry import AuditInputError, load_registry
from zeromismatch.audit.verdicts import (
    NOT_REPRODUCED,
    NOT_RUN,
    OUT_OF_REACH,
    REPRODUCED_DIRECTION,
    REPRODUCED_EXACT,
    evaluate_all,
    verdicts_document,
)
from zeromismatch.cli import main

EXP = "deepseek_v4_flash_100steps"


def _verdicts(results, experiment=None):
    return {v.claim_id: v for v in evaluate_all(load_registry(results), results, experiment)}


def test_no_runs_gives_not_run_with_command_or_out_of_reach(results):
    verdicts = _verdicts(results)
    assert verdicts
    for v in verdicts.values():
        assert v.verdict in (NOT_RUN, OUT_OF_REACH)
        assert v.measured == [] and v.run is None
        if v.verdict == NOT_RUN:
            assert v.command and v.command.startswith("python ")
        else:
            assert v.needs
    assert verdicts["S3-coverage-amd-mi355x"].verdict == OUT_OF_REACH
    assert "MI355X" in " ".join(verdicts["S3-coverage-amd-mi355x"].needs)


def test_all_five_verdicts_from_one_synthetic_run(results):
    write_run(results, EXP, "mini", "run-a", records=deepseek_records(120))
    v = _verdicts(results, EXP)
    zero = v["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == REPRODUCED_EXACT, zero.reason
    assert zero.run == f"reproduced/{EXP}/mini/run-a/" and zero.scale == "mini" and zero.steps == 120
    assert zero.provenance["git_commit"].startswith("0123456789")
    kl = v["S1-dsv4base-kl-2e-3-to-29.9"]
    assert kl.verdict == REPRODUCED_DIRECTION, kl.reason
    reward = v["S1-dsv4base-reward-fell"]
    assert reward.verdict == NOT_REPRODUCED and "reward falls" in reward.reason
    assert v["S1-dsv4-invariances"].verdict == NOT_RUN  # run has no summary keys for it
    assert "none records" in v["S1-dsv4-invariances"].reason
    assert v["S1-dsv41-zero-diff"].verdict == OUT_OF_REACH


def test_measured_values_are_exactly_what_the_files_hold(results):
    records = deepseek_records(120)
    write_run(results, EXP, "mini", "run-a", records=records)
    kl = _verdicts(results, EXP)["S1-dsv4base-kl-2e-3-to-29.9"]
    series = np.array([r["default.k3_kl"] for r in records])
    window = math.ceil(0.1 * len(series))
    measured = {m.label: m.value for m in kl.measured}
    assert measured["default k3 KL, last 10% of steps"] == float(np.mean(series[-window:]))
    assert measured["default k3 KL, first 10% of steps"] == float(np.mean(series[:window]))


def test_exact_zero_fails_on_one_nonzero_step_and_on_nan(results):
    records = deepseek_records(120)
    records[57]["aligned.k3_kl"] = 5e-324  # smallest subnormal: still not zero
    write_run(results, EXP, "mini", "run-a", records=records)
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == NOT_REPRODUCED and "1 steps nonzero" in zero.reason

    records[57]["aligned.k3_kl"] = float("nan")
    write_run(results, EXP, "mini", "run-a", records=records)
    assert _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"].verdict == NOT_REPRODUCED


def test_exact_zero_needs_min_steps(results):
    write_run(results, EXP, "mini", "short", records=deepseek_records(50))
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == NOT_REPRODUCED and "needs at least 101" in zero.reason


def test_exact_claim_with_vacuous_inverse_is_not_reproduced(results):
    records = deepseek_records(120)
    for record in records:
        record["default.diff_max"] = 0.0
    write_run(results, EXP, "mini", "run-a", records=records)
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == NOT_REPRODUCED and "inverse" in zero.reason


def test_arm_field_records_are_read_like_prefixed_keys(results):
    records = []
    for record in deepseek_records(120):
        for arm in ("aligned", "default"):
            sub = {k.split(".", 1)[1]: val for k, val in record.items() if k.startswith(arm + ".")}
            records.append({"step": record["step"], "arm": arm, **sub})
    write_run(results, EXP, "mini", "run-a", records=records)
    v = _verdicts(results, EXP)
    assert v["S1-dsv4-zero-diff-every-step"].verdict == REPRODUCED_EXACT
    assert v["S1-dsv4base-kl-2e-3-to-29.9"].verdict == REPRODUCED_DIRECTION


def test_scale_preference_full_over_mini_then_newest_name_and_smoke_judges_nothing(results):
    write_run(results, EXP, "smoke", "s", records=deepseek_records(120))
    smoke_only = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert smoke_only.verdict == NOT_RUN and "full, mini" in smoke_only.reason
    write_run(results, EXP, "mini", "2026-01-01", records=deepseek_records(120, aligned_zero=False))
    write_run(results, EXP, "mini", "2026-02-01", records=deepseek_records(120))
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.run == f"reproduced/{EXP}/mini/2026-02-01/" and zero.verdict == REPRODUCED_EXACT
    write_run(results, EXP, "full", "f", records=deepseek_records(120, aligned_zero=False))
    full = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert full.run == f"reproduced/{EXP}/full/f/" and full.verdict == NOT_REPRODUCED


def test_summary_operands_and_exact_rule(results):
    summary = {
        "aligned.batch_invariance_diff_max": 0.0,
        "aligned.phase_invariance_diff_max": 0.0,
        "aligned.layout_invariance_diff_max": 0.0,
        "default.batch_invariance_diff_max": 3.1e-6,
    }
    write_run(results, EXP, "mini", "run-a", summary=summary)
    assert _verdicts(results, EXP)["S1-dsv4-invariances"].verdict == REPRODUCED_EXACT
    summary["aligned.layout_invariance_diff_max"] = 2e-7
    write_run(results, EXP, "mini", "run-a", summary=summary)
    inv = _verdicts(results, EXP)["S1-dsv4-invariances"]
    assert inv.verdict == NOT_REPRODUCED and "layout" in inv.reason


def test_benchmark_claims(results):
    claim = "S1-dsv4-rollout-throughput-91.3pct"
    bench = "rollout_tiny-deepseek-v3"  # the experiment's DeepSeek stand-in, not tiny-qwen3's rollout.json
    assert _verdicts(results, EXP)[claim].verdict == NOT_RUN
    write_benchmark(results, bench, {"ratio_aligned_over_default": 0.42, "provenance": {"git_commit": "abc"}})
    slow = _verdicts(results, EXP)[claim]
    assert slow.verdict == NOT_REPRODUCED and slow.speed_ratio == 0.42
    assert slow.run == f"reproduced/benchmarks/{bench}.json" and slow.provenance["git_commit"] == "abc"
    write_benchmark(results, bench, {"ratio_aligned_over_default": 0.95})
    assert _verdicts(results, EXP)[claim].verdict == REPRODUCED_DIRECTION
    write_benchmark(results, bench, {"ratios": {"ratio_aligned_over_default": 0.95}})
    missing = _verdicts(results, EXP)[claim]  # a nested key is not the key the claim names
    assert missing.verdict == NOT_RUN and "ratio_aligned_over_default" in missing.reason


def test_abs_dev_from_and_plot_ratio(results):
    records = []
    for step in range(20):
        records.append({"step": step, "arm": "v1_first", "is_mean": 1.2})
        records.append({"step": step, "arm": "v1_fixed", "is_mean": 0.99})
    write_run(results, "pipelinerl_v0_v1", "mini", "r", records=records)
    ratio = _verdicts(results, "pipelinerl_v0_v1")["S2-processed-logprobs-ratio-1.0"]
    assert ratio.verdict == REPRODUCED_DIRECTION
    assert {round(m.value, 12) for m in ratio.measured if m.passed} == {0.01, 0.2}
    step_times = [
        {
            "step": s,
            "aligned.time_rollout_s": 1.5,
            "aligned.time_learner_s": 0.5,
            "default.time_rollout_s": 1.0,
            "default.time_learner_s": 0.6,
        }
        for s in range(5)
    ]
    write_run(results, "osworld_step_time", "mini", "r", records=step_times)
    osw = _verdicts(results, "osworld_step_time")["S3-osworld-step-time-944.25-vs-884.17"]
    assert osw.verdict == REPRODUCED_DIRECTION and osw.speed_ratio == pytest.approx(0.8)


def _unprefixed(records: list[dict], arm: str) -> list[dict]:
    return [
        {"step": r["step"], **{k.split(".", 1)[1]: v for k, v in r.items() if k.startswith(arm + ".")}}
        for r in records
    ]


def test_one_run_directory_per_arm_is_judged_as_a_group(results):
    """The layout zeromismatch.rl.loop writes: mini/aligned/ and mini/default/, unprefixed keys."""
    records = deepseek_records(120)
    for arm in ("aligned", "default"):
        write_run(results, EXP, "mini", arm, records=_unprefixed(records, arm))
    v = _verdicts(results, EXP)
    zero = v["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == REPRODUCED_EXACT, zero.reason
    assert zero.run == f"reproduced/{EXP}/mini/" and zero.steps == 120
    assert zero.provenance_files == [
        f"reproduced/{EXP}/mini/aligned/provenance.json",
        f"reproduced/{EXP}/mini/default/provenance.json",
    ]
    assert any("mini/aligned/metrics.jsonl diff_max all" in m.source for m in zero.measured)
    assert v["S1-dsv4base-kl-2e-3-to-29.9"].verdict == REPRODUCED_DIRECTION


def test_arm_subdirectories_of_one_run(results):
    records = deepseek_records(120)
    for arm in ("aligned", "default"):
        write_run(results, EXP, "mini", f"2026-03-01/{arm}", records=_unprefixed(records, arm))
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == REPRODUCED_EXACT and zero.run == f"reproduced/{EXP}/mini/2026-03-01/"


def test_summary_operands_per_arm(results):
    before, after = {"eval_pass_at_1_before": 0.4}, {"aligned": 0.45, "default": 0.2}
    for arm in ("aligned", "default"):
        write_run(
            results,
            "reinforce_zero_lag64",
            "mini",
            arm,
            summary={**before, "eval_pass_at_1_after": after[arm]},
        )
    v = _verdicts(results, "reinforce_zero_lag64")
    aime = v["S3-default-aime24-34.27-to-13.96"]
    assert aime.verdict == REPRODUCED_DIRECTION
    # default falls (0.4 -> 0.2) while aligned holds (0.4 -> 0.45)
    assert [m.value for m in aime.measured if m.passed] == [0.2, 0.4, 0.45, 0.4]
    assert v["S3-grad-norm-38.27-vs-0.0555"].verdict == NOT_RUN  # no metrics.jsonl in these runs


def test_baseline_fall_is_not_reproduced_when_aligned_falls_too(results):
    after = {"aligned": 0.1, "default": 0.2}
    for arm in ("aligned", "default"):
        summary = {"eval_pass_at_1_before": 0.4, "eval_pass_at_1_after": after[arm]}
        write_run(results, "reinforce_zero_lag64", "mini", arm, summary=summary)
    v = _verdicts(results, "reinforce_zero_lag64")
    assert v["S3-default-aime24-34.27-to-13.96"].verdict == NOT_REPRODUCED


def test_malformed_summary_is_one_error_naming_the_file(results):
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(10))
    (run / "summary.json").write_text("{not json")
    with pytest.raises(AuditInputError, match=r"malformed summary\.json .*run-a/summary\.json"):
        _verdicts(results, EXP)
    (run / "summary.json").write_text(json.dumps({"aligned.batch_invariance_diff_max": "zero"}))
    with pytest.raises(AuditInputError, match=r"summary\.json .*aligned\.batch_invariance_diff_max"):
        _verdicts(results, EXP)


def test_malformed_metrics_line_names_file_and_line(results):
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(3))
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{oops\n")
    with pytest.raises(AuditInputError, match=r"metrics\.jsonl .*run-a/metrics\.jsonl: line 4"):
        _verdicts(results, EXP)


def _commit(results):
    verdicts = evaluate_all(load_registry(results), results)
    (results / "verdicts.json").write_text(json.dumps(verdicts_document(verdicts)))


def test_cli_strict_holds_then_fails_when_a_reproduced_verdict_regresses(results, capsys):
    run = seal_run(write_run(results, EXP, "mini", "run-a", records=deepseek_records(120)))
    assert main(["audit", "--results", str(results), "--strict"]) == 0  # nothing committed yet
    _commit(results)
    assert main(["audit", "--results", str(results), "--strict"]) == 0
    out = capsys.readouterr().out
    assert "S1-dsv4-zero-diff-every-step" in out and REPRODUCED_EXACT in out

    bad = deepseek_records(120)
    bad[3]["aligned.diff_max"] = 1e-9
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert main(["audit", "--results", str(results)]) == 0  # without --strict: table only
    assert main(["audit", "--results", str(results), "--strict"]) == 1
    err = capsys.readouterr().err
    assert "S1-dsv4-zero-diff-every-step: committed reproduced-exact, now not-reproduced" in err
    # Filtering to an unaffected experiment passes; the affected one fails.
    assert main(["audit", "--results", str(results), "--strict", "--experiment", "osworld_step_time"]) == 0
    assert main(["audit", "--results", str(results), "--strict", "--experiment", EXP]) == 1


def test_cli_strict_fails_when_the_run_disappears(results):
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(120))
    _commit(results)
    for path in run.iterdir():
        path.unlink()
    run.rmdir()
    assert main(["audit", "--results", str(results), "--strict"]) == 1


def test_cli_json_contract_and_errors(results, capsys):
    assert main(["audit", "--results", str(results), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["verdict"] for r in rows} == {NOT_RUN, OUT_OF_REACH}
    assert main(["audit", "--results", str(results), "--contract"]) == 0
    assert "arm aligned: metrics.jsonl diff_max (all)" in capsys.readouterr().out
    assert main(["audit", "--results", str(results), "--experiment", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    (results / "published" / "osworld_step_time.json").write_text("[]")
    assert main(["audit", "--results", str(results)]) == 2
    assert "osworld_step_time.json" in capsys.readouterr().err


@pytest.mark.parametrize(("default_peak", "expected"), [(18.0, NOT_REPRODUCED), (31.0, REPRODUCED_DIRECTION)])
def test_effect_size_factor_needs_a_clear_effect_not_a_bare_inequality(results, default_peak, expected):
    """IS peak/median carries factor 2: default 18 vs aligned 15 is larger but not twice as large."""
    peaks = {"aligned": 15.0, "default": default_peak}
    for arm, peak in peaks.items():
        write_run(
            results, "reinforce_zero_lag64", "mini", arm, records=[{"step": 0, "peak_over_median": peak}]
        )
    verdict = _verdicts(results, "reinforce_zero_lag64")["S3-is-peak-over-median-1.50-vs-442.54"]
    assert verdict.verdict == expected, verdict.reason
    if expected == NOT_REPRODUCED:
        assert "2 x aligned, largest peak/median = 30" in verdict.reason
    # the measured values are the files' values, never the scaled threshold
    assert [m.value for m in verdict.measured if m.passed is not None] == [default_peak, 15.0]


def test_one_infinite_step_cannot_decide_a_trend_and_an_infinite_max_still_counts(results):
    # The learner writes inf for a step where the trainer gives a sampled token probability 0. A mean
    # over such a step used to decide "KL grows" on its own (found by review); an extreme over it is
    # honestly inf, so the inverse "default diff_max > 0" still holds.
    records = deepseek_records(120, aligned_zero=True)
    for record in records:
        record["default.k3_kl"] = 1e-4  # flat: the KL does not grow
    records[-1]["default.k3_kl"] = math.inf
    records[-1]["default.diff_max"] = math.inf
    write_run(results, EXP, "mini", "run-a", records=records)
    v = _verdicts(results, EXP)
    kl = v["S1-dsv4base-kl-2e-3-to-29.9"]
    # neither reproduced nor refuted by an inf step: not-run, saying why
    assert kl.verdict == NOT_RUN and "cannot be decided on non-finite values" in kl.reason
    assert "1 of 12 step values non-finite" in kl.reason
    assert v["S1-dsv4-zero-diff-every-step"].verdict == REPRODUCED_EXACT  # its inverse reads max: inf > 0


def test_arms_from_different_commits_are_not_compared(results):
    # a re-run of one arm at a new commit next to a stale one: the code between may change what a
    # metric means, so the claim is not judged until the arms are rerun together
    records = deepseek_records(120)
    commits = {"aligned": "a" * 40, "default": "b" * 40}
    for arm, commit in commits.items():
        provenance = {"git_commit": commit}
        write_run(results, EXP, "mini", arm, records=_unprefixed(records, arm), provenance=provenance)
    zero = _verdicts(results, EXP)["S1-dsv4-zero-diff-every-step"]
    assert zero.verdict == NOT_RUN and "2 commits (aaaaaaa, bbbbbbb)" in zero.reason
    assert "--force" in zero.reason


def test_a_value_a_postprocess_wrote_at_another_commit_is_not_compared(tmp_path, results):
    # add_to_summary records who computed a derived value; a postprocess at a later commit (or over
    # an input run of another commit) used to be cited with the arm's own commit
    from zeromismatch.experiment.spec import add_to_summary

    before, after = {"eval_pass_at_1_before": 0.4}, {"aligned": 0.45, "default": 0.2}
    claim, provenance = "S3-default-aime24-34.27-to-13.96", {"git_commit": "a" * 40}
    runs = {
        arm: write_run(results, "reinforce_zero_lag64", "mini", arm,
                       summary={**before, "eval_pass_at_1_after": after[arm]}, provenance=provenance)
        for arm in ("aligned", "default")
    }  # fmt: skip
    assert _verdicts(results, "reinforce_zero_lag64")[claim].verdict == REPRODUCED_DIRECTION
    add_to_summary(runs["default"], {"eval_pass_at_1_after": 0.2}, inputs=(runs["aligned"],))
    summary = json.loads((runs["default"] / "summary.json").read_text())
    record = summary["derived_provenance"]["eval_pass_at_1_after"]
    assert record["inputs"] == {"aligned": "a" * 40} and record["git_commit"] not in ("", "a" * 40)
    aime = _verdicts(results, "reinforce_zero_lag64")[claim]
    assert aime.verdict == NOT_RUN and "2 commits" in aime.reason  # this checkout's commit is not "aaa..."
