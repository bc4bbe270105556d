"""Seeded arms (``<scale>/<arm>/seed<k>/``): discovery, operands ``over_seeds``, seed-level noise
floors, exact zero on every step of every seed, shared warm starts, and tamper evidence.

The claims are written into the tmp copy of the registry (one experiment's file replaced by the
claims each test needs); every number is made up, and each expected value is computed here by hand
(statistics module, independent of the audit's numpy).
"""

from __future__ import annotations

import json
import statistics

import pytest
from audit_helpers import seal_run, write_run

from zeromismatch.audit.figures import _curve_sources
from zeromismatch.audit.html import render_html
from zeromismatch.audit.integrity import check_results
from zeromismatch.audit.registry import AuditInputError, load_registry
from zeromismatch.audit.report import render_markdown
from zeromismatch.audit.runs import all_runs, resolve_operand
from zeromismatch.audit.verdicts import (
    NOT_REPRODUCED,
    NOT_RUN,
    REPRODUCED_DIRECTION,
    REPRODUCED_EXACT,
    evaluate_all,
)

EXP = "qwen3_30b_a3b_tools"
REL = f"reproduced/{EXP}/mini"
JITTER = 1e-4  # step noise within a seed: far below the spread between seeds


def _claims(results, *tests: dict) -> None:
    """Replace EXP's claims with one claim per test (ids S3-seeded-0, S3-seeded-1, ...)."""
    path = results / "published" / f"{EXP}.json"
    doc = json.loads(path.read_text())
    template = doc["claims"][0]
    doc["claims"] = [
        {**template, "id": f"S3-seeded-{i}", "test": {"command": template["test"]["command"], **test}}
        for i, test in enumerate(tests)
    ]
    path.write_text(json.dumps(doc))


def _verdicts(results):
    return evaluate_all(load_registry(results), results, EXP)


def _seeded(results, arm: str, levels: list[float], steps: int = 20, key: str = "k3_kl", summaries=None):
    """One seed dir per level: ``steps`` values alternating level +- JITTER (tail means = level)."""
    for seed, level in enumerate(levels):
        records = [{"step": s, key: level + (JITTER if s % 2 else -JITTER)} for s in range(steps)]
        summary = summaries[seed] if summaries else None
        write_run(results, EXP, "mini", f"{arm}/seed{seed}", records=records, summary=summary)


def _kl(arm: str, **extra) -> dict:
    return {"metric": "k3_kl", "arm": arm, "agg": "tail_mean", "over_seeds": "mean", **extra}


def _welch_z(lhs: list[float], rhs: list[float]) -> float:
    error = (statistics.variance(lhs) / len(lhs) + statistics.variance(rhs) / len(rhs)) ** 0.5
    return (statistics.fmean(lhs) - statistics.fmean(rhs)) / error


def _kl_check(min_z: float | None = 2.0) -> dict:
    check = {"lhs": _kl("default"), "op": ">", "rhs": _kl("aligned"), "label": "default k3 KL above aligned"}
    if min_z is not None:
        check["min_z"] = min_z
    return {"rule": "direction", "data": "run", "checks": [check]}


# discovery


def test_seeded_arms_are_arms_of_the_scale_group_in_seed_order(results):
    for seed in (2, 0, 10, 1):  # seed10 sorts after seed2 by number, before it by name
        write_run(results, EXP, "mini", f"fast/seed{seed}", records=[{"step": 0, "k3_kl": float(seed)}])
    write_run(results, EXP, "mini", "fast/.seed3.partial", records=[{"step": 0, "k3_kl": 3.0}])
    write_run(results, EXP, "mini", "aligned", records=[{"step": 0, "k3_kl": 0.0}])
    runs = all_runs(results, EXP)
    # fast/ is no candidate of its own: a seed's numbers alone are not the arm's
    assert [run.rel for run in runs] == [f"{REL}/aligned/", f"{REL}/"]
    group = runs[-1]
    assert list(group.arms) == ["aligned"] and list(group.seeds) == ["fast"]
    assert [(seed, data.rel) for seed, data in group.seeds["fast"]] == [
        (seed, f"{REL}/fast/seed{seed}/") for seed in (0, 1, 2, 10)
    ]
    assert [d.rel for d in group.data_dirs()] == [f"{REL}/aligned/"] + [
        f"{REL}/fast/seed{seed}/" for seed in (0, 1, 2, 10)
    ]
    assert [label for label, _ in _curve_sources(runs)["mini"]] == [
        "aligned",
        *["fast (4 seeds)"] * 4,
    ]


def test_a_runs_own_seeded_arm_is_found_too(results):
    write_run(results, EXP, "mini", "run-a/aligned", records=[{"step": 0, "k3_kl": 0.0}])
    for seed in (0, 1):
        write_run(results, EXP, "mini", f"run-a/fast/seed{seed}", records=[{"step": 0, "k3_kl": 1.0}])
    (run,) = all_runs(results, EXP)
    assert run.rel == f"{REL}/run-a/" and list(run.arms) == ["aligned"]
    assert [seed for seed, _ in run.seeds["fast"]] == [0, 1]
    assert [label for label, _ in _curve_sources([run])["mini"]] == [
        "run-a/aligned",
        "run-a/fast (2 seeds)",
        "run-a/fast (2 seeds)",
    ]


@pytest.mark.parametrize(
    ("dirs", "message"),
    [
        (["fast", "fast/seed0"], "holds data files of its own and seed dirs"),
        (["fast/seed0", "fast/other"], r"holds seed dirs \(seed0\) and other data dirs \(other\)"),
        (["fast/seed1", "fast/seed01"], "seed01/ and seed1/ are both seed 1"),
    ],
)
def test_ambiguous_seed_layouts_are_input_errors(results, dirs, message):
    for name in dirs:
        write_run(results, EXP, "mini", name, records=[{"step": 0, "k3_kl": 0.0}])
    with pytest.raises(AuditInputError, match=message):
        all_runs(results, EXP)


# resolution and reporting


def test_mean_over_seeds_with_per_seed_values_in_source_and_report(results):
    _seeded(results, "default", [1.0, 1.1, 1.2])
    _seeded(results, "aligned", [0.1, 0.2, 0.3])
    _claims(results, _kl_check())
    group = all_runs(results, EXP)[-1]
    got = resolve_operand(_kl("aligned"), run=group)
    assert got.value == pytest.approx(0.2) and got.data is None
    assert [seed for seed, _ in got.per_seed] == [0, 1, 2]
    assert [v for _, v in got.per_seed] == pytest.approx([0.1, 0.2, 0.3])
    assert got.samples == [v for _, v in got.per_seed]
    assert got.steps == 20 and [d.rel for d in got.data_dirs] == [f"{REL}/aligned/seed{k}/" for k in range(3)]
    assert got.source == (
        f"{REL}/aligned/seed{{0,1,2}}/metrics.jsonl k3_kl tail_mean of 2 of 20 steps, "
        "mean over 3 seeds (0.1, 0.2, 0.3)"
    )
    assert got.label == "aligned.k3_kl (tail_mean), mean over seeds"

    registry = load_registry(results)
    verdicts = evaluate_all(registry, results, EXP)
    (verdict,) = verdicts
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason
    assert verdict.run == f"{REL}/" and verdict.steps == 20
    aligned = next(m for m in verdict.measured if m.label.startswith("aligned.k3_kl"))
    assert aligned.value == pytest.approx(0.2)
    assert aligned.source == got.source + "; spread 0.1..0.3 across seeds"
    # every seed dir is a data dir of the verdict, with its provenance
    assert [entry["data"] for entry in verdict.arm_provenance] == [
        f"{REL}/{arm}/seed{k}/" for arm in ("default", "aligned") for k in range(3)
    ]
    md = render_markdown(registry, verdicts, {})
    page = render_html(registry, verdicts, {})
    for text in (md, page):
        assert "mean over 3 seeds (0.1, 0.2, 0.3); spread 0.1..0.3 across seeds" in text
        assert "mean over 3 seeds (1, 1.1, 1.2); spread 1..1.2 across seeds" in text
    assert "aligned.k3_kl (tail_mean), mean over seeds = 0.2 (holds; " in md


def test_seeds_read_differently_are_each_named(results):
    _seeded(results, "aligned", [0.1, 0.2])
    write_run(results, EXP, "mini", "aligned/seed2", records=[{"step": s, "k3_kl": 0.3} for s in range(10)])
    got = resolve_operand(_kl("aligned"), run=all_runs(results, EXP)[-1])
    assert got.source == (
        f"{REL}/aligned/{{seed0/metrics.jsonl k3_kl tail_mean of 2 of 20 steps; "
        "seed1/metrics.jsonl k3_kl tail_mean of 2 of 20 steps; "
        "seed2/metrics.jsonl k3_kl tail_mean of 1 of 10 steps}, mean over 3 seeds (0.1, 0.2, 0.3)"
    )
    assert got.steps == 10


def test_min_z_over_seeds_clears_a_seed_level_noise_floor(results):
    default, aligned = [1.0, 1.1, 1.2], [0.1, 0.15, 0.2]
    _seeded(results, "default", default)
    _seeded(results, "aligned", aligned)
    _claims(results, _kl_check())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason
    (z,) = [m for m in verdict.measured if m.label.startswith("z, ")]
    assert z.value == pytest.approx(_welch_z(default, aligned), rel=1e-9) and z.value > 2
    assert "(Welch, 3 vs 3 seeds as samples); needs z >= 2" in verdict.reason


def test_a_difference_within_seed_noise_is_not_reproduced(results):
    # the means differ and each seed's curve is steady (steps as samples would give z in the
    # thousands), but the seeds disagree by more than the difference: within noise at seed level
    default, aligned = [0.2, 1.0, 0.6], [0.3, 0.5, 0.4]
    _seeded(results, "default", default)
    _seeded(results, "aligned", aligned)
    _claims(results, _kl_check())
    (verdict,) = _verdicts(results)
    expected = _welch_z(default, aligned)
    assert 0 < expected < 2
    assert verdict.verdict == NOT_REPRODUCED
    assert "the difference is within noise (z = " in verdict.reason
    assert "(Welch, 3 vs 3 seeds as samples)" in verdict.reason
    (z,) = [m for m in verdict.measured if m.label.startswith("z, ")]
    assert z.value == pytest.approx(expected, rel=1e-9)


def test_one_seed_per_side_gives_no_seed_level_standard_error(results):
    _seeded(results, "default", [1.0])
    _seeded(results, "aligned", [0.1])
    _claims(results, _kl_check())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_REPRODUCED
    assert "z undefined: needs at least 2 seeds on each side, has 1 and 1" in verdict.reason


# not-run: the data do not fit the claim


def test_an_operand_without_over_seeds_on_a_seeded_arm_is_not_run(results):
    _seeded(results, "default", [1.0, 1.1, 1.2])
    _seeded(results, "aligned", [0.1, 0.2, 0.3])
    check = _kl_check(min_z=None)
    del check["checks"][0]["lhs"]["over_seeds"]
    _claims(results, check)
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert (
        f"{REL}/default/ ran on 3 seeds (seed0, seed1, seed2); the claim must say how to combine them "
        "(over_seeds)" in verdict.reason
    )


def test_over_seeds_on_an_arm_run_once_is_not_run(results):
    _seeded(results, "default", [1.0, 1.1, 1.2])
    write_run(results, EXP, "mini", "aligned", records=[{"step": s, "k3_kl": 0.1} for s in range(20)])
    _claims(results, _kl_check(min_z=None))
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert f"{REL}/aligned/ ran on one seed (no seed<k>/ dirs)" in verdict.reason


def test_fewer_seeds_than_min_seeds_is_not_run(results):
    _seeded(results, "default", [1.0, 1.1, 1.2])
    _seeded(results, "aligned", [0.1, 0.2, 0.3])
    test = _kl_check()
    test["checks"][0]["lhs"]["min_seeds"] = 4
    _claims(results, test)
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert f"{REL}/default/ ran on 3 seed(s) (seed0, seed1, seed2);" in verdict.reason
    assert "needs at least 4" in verdict.reason
    test["checks"][0]["lhs"]["min_seeds"] = 3
    _claims(results, test)
    assert _verdicts(results)[0].verdict == REPRODUCED_DIRECTION


def test_a_seed_that_does_not_record_the_operand_is_not_run(results):
    _seeded(results, "default", [1.0, 1.1, 1.2])
    _seeded(results, "aligned", [0.1, 0.2])
    write_run(results, EXP, "mini", "aligned/seed2", records=[{"step": 0, "other": 1.0}])
    _claims(results, _kl_check())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert f"{REL}/aligned/seed2/ has no metrics series k3_kl" in verdict.reason


# exact zero over seeds


def _zero_test(min_steps: int = 10) -> dict:
    operand = {"metric": "diff_max", "arm": "aligned", "agg": "all", "over_seeds": "mean"}
    return {"rule": "exact", "data": "run", "exact_zero": [operand], "min_steps": min_steps}


def _zero_seeds(results, steps=(12, 10, 11), nonzero: tuple[int, int] | None = None):
    for seed, count in enumerate(steps):
        records = [{"step": s, "diff_max": 0.0} for s in range(count)]
        if nonzero and nonzero[0] == seed:
            records[nonzero[1]]["diff_max"] = 1e-9
        write_run(results, EXP, "mini", f"aligned/seed{seed}", records=records)


def test_exact_zero_over_seeds_holds_when_every_step_of_every_seed_is_zero(results):
    _zero_seeds(results)
    _claims(results, _zero_test())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == REPRODUCED_EXACT, verdict.reason
    assert verdict.steps == 10  # the fewest steps any seed recorded
    (zero,) = verdict.measured
    assert zero.source.startswith(f"{REL}/aligned/{{seed0/metrics.jsonl diff_max all over 12 steps; ")
    assert "every step of 3 seeds (max |value| per seed: 0, 0, 0)" in zero.source
    assert "over 33 step values of 3 seeds (at least 10 steps each); 0 steps nonzero" in zero.source


def test_exact_zero_over_seeds_fails_on_one_nonzero_step_of_one_seed(results):
    _zero_seeds(results, nonzero=(1, 4))
    _claims(results, _zero_test())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_REPRODUCED
    assert "not zero at every step (max |value| 1e-09 over 33 step values of 3 seeds" in verdict.reason
    assert "1 steps nonzero" in verdict.reason
    assert "max |value| per seed: 0, 1e-09, 0" in verdict.measured[0].source


def test_exact_zero_over_seeds_counts_every_seeds_null_steps_and_shortest_run(results):
    _zero_seeds(results)
    _claims(results, _zero_test(min_steps=11))
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_REPRODUCED
    assert "zero on 10 recorded steps; the claim needs at least 11" in verdict.reason
    path = results / REL / "aligned" / "seed2" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = json.dumps({"step": 3, "diff_max": None})
    path.write_text("\n".join(lines) + "\n")
    _claims(results, _zero_test())
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_REPRODUCED and "1 steps recorded null or missing" in verdict.reason


def test_exact_zero_of_a_mean_over_seeds_needs_every_seed_zero(results):
    # seeds of opposite sign average to 0: that is not "exactly 0"
    for seed, gap in enumerate((1e-3, -1e-3, 0.0)):
        write_run(results, EXP, "mini", f"aligned/seed{seed}", summary={"gap": gap})
    operand = {"summary": "gap", "arm": "aligned", "over_seeds": "mean"}
    _claims(results, {"rule": "exact", "data": "run", "exact_zero": [operand]})
    (verdict,) = _verdicts(results)
    assert verdict.measured[0].value == 0.0
    assert verdict.verdict == NOT_REPRODUCED
    assert "not exactly 0 on every seed (nonzero on 2 of 3 seeds)" in verdict.reason


# shared warm start


def _pass_at_1(arm: str) -> dict:
    return {"summary": "eval_pass_at_1_after", "arm": arm, "over_seeds": "mean"}


def _warm_claim(results) -> None:
    check = {
        "lhs": _pass_at_1("aligned"),
        "op": ">",
        "rhs": _pass_at_1("default"),
        "label": "aligned learns more",
    }
    _claims(results, {"rule": "direction", "data": "run", "checks": [check]})


def _warm_seeds(results, arm: str, after: float, warm: list[str | None]) -> None:
    for seed, sha in enumerate(warm):
        summary = {"eval_pass_at_1_after": after + 0.01 * seed}
        if sha is not None:
            summary["warm_start_sha256"] = sha
        write_run(results, EXP, "mini", f"{arm}/seed{seed}", summary=summary)


def test_arms_from_one_warm_start_are_judged(results):
    _warm_seeds(results, "aligned", 0.5, ["ab" * 32] * 3)
    _warm_seeds(results, "default", 0.2, ["ab" * 32] * 3)
    _warm_claim(results)
    (verdict,) = _verdicts(results)
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason


def test_arms_from_different_warm_starts_are_not_run(results):
    _warm_seeds(results, "aligned", 0.5, ["ab" * 32] * 3)
    _warm_seeds(results, "default", 0.2, ["ab" * 32, "ef" * 32, "ab" * 32])
    _warm_claim(results)
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert verdict.reason == (
        "its arms start RL from 2 different warm starts (abababa, efefefe): a difference between arms "
        "would not be a difference between numerics"
    )
    assert verdict.measured  # still shown: what was measured, and why it decides nothing


def test_a_data_dir_without_a_warm_start_among_ones_with_it_is_not_run(results):
    _warm_seeds(results, "aligned", 0.5, ["ab" * 32] * 3)
    _warm_seeds(results, "default", 0.2, ["ab" * 32, None, "ab" * 32])
    _warm_claim(results)
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN
    assert (
        f"1 of the 6 data dirs it reads record no warm_start_sha256 ({REL}/default/seed1/)" in verdict.reason
    )


def test_unseeded_arms_from_different_warm_starts_are_not_run_and_none_recorded_is_as_before(results):
    for arm, sha in (("aligned", "ab" * 32), ("default", "ef" * 32)):
        summary = {"eval_pass_at_1_before": 0.3, "eval_pass_at_1_after": 0.5, "warm_start_sha256": sha}
        write_run(results, EXP, "mini", arm, summary=summary)
    check = {
        "lhs": {"summary": "eval_pass_at_1_after", "arm": "aligned"},
        "op": ">",
        "rhs": {"summary": "eval_pass_at_1_before", "arm": "default"},
        "label": "aligned after above default before",
    }
    _claims(results, {"rule": "direction", "data": "run", "checks": [check]})
    (verdict,) = _verdicts(results)
    assert verdict.verdict == NOT_RUN and "2 different warm starts (abababa, efefefe)" in verdict.reason
    for arm in ("aligned", "default"):
        write_run(
            results, EXP, "mini", arm, summary={"eval_pass_at_1_before": 0.3, "eval_pass_at_1_after": 0.5}
        )
    (verdict,) = _verdicts(results)
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason


def test_a_warm_start_that_is_not_a_hash_is_an_input_error(results):
    _warm_seeds(results, "aligned", 0.5, ["ab" * 32, "ab" * 32])
    _warm_seeds(results, "default", 0.2, ["ab" * 32, 7])
    _warm_claim(results)
    with pytest.raises(
        AuditInputError, match=r"default/seed1/summary.json: warm_start_sha256 should be a hash"
    ):
        _verdicts(results)


# registry and schema


def test_schema_and_registry_accept_over_seeds_and_min_seeds(results):
    both_max = _kl_check()
    for side in ("lhs", "rhs"):
        both_max["checks"][0][side].update(agg="max", min_seeds=2)  # over seeds, any agg but 'all'
    summaries = {
        "rule": "direction",
        "data": "run",
        "checks": [{"lhs": _pass_at_1("aligned"), "op": ">", "rhs": _pass_at_1("default"),
                    "label": "summaries over seeds", "min_z": 2.0}],
    }  # fmt: skip
    _claims(results, _kl_check(), both_max, summaries, _zero_test())
    claims = load_registry(results).by_id()
    assert claims["S3-seeded-1"]["test"]["checks"][0]["lhs"]["min_seeds"] == 2


def _rejected(results, test: dict, message: str) -> None:
    _claims(results, test)
    with pytest.raises(AuditInputError, match=message):
        load_registry(results)


def test_min_z_still_needs_means_of_series_when_not_over_seeds(results):
    test = _kl_check()
    for side in ("lhs", "rhs"):
        del test["checks"][0][side]["over_seeds"]
    test["checks"][0]["lhs"]["agg"] = "max"
    _rejected(results, test, "its lhs is not a mean of a metrics series")


@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_min_z_rejects_seeds_on_one_side_only(results, side):
    test = _kl_check()
    del test["checks"][0][side]["over_seeds"]
    other = "rhs" if side == "lhs" else "lhs"
    _rejected(results, test, f"but only its {other} is over seeds")


def test_min_z_rejects_seeds_against_a_number(results):
    test = _kl_check()
    test["checks"][0]["rhs"] = 0.5
    _rejected(results, test, "but only its lhs is over seeds")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda op: op.pop("arm"), "over_seeds needs an arm"),
        (lambda op: (op.pop("over_seeds"), op.update(min_seeds=3)), "min_seeds without over_seeds"),
        (lambda op: op.update(min_seeds=1), "min_seeds"),  # the schema: minimum 2
        (lambda op: op.update(over_seeds="median"), "over_seeds"),  # the schema: 'mean' only
    ],
)
def test_bad_seed_operands_are_rejected(results, change, message):
    test = _kl_check(min_z=None)
    change(test["checks"][0]["lhs"])
    _rejected(results, test, message)


# tamper evidence


def test_an_edited_seed_metrics_file_is_a_finding(results):
    _seeded(results, "aligned", [0.1, 0.2, 0.3])
    for seed in range(3):
        seal_run(results / REL / "aligned" / f"seed{seed}")
    assert check_results(results).findings == []  # the seeded arm dir itself holds no run files
    path = results / REL / "aligned" / "seed1" / "metrics.jsonl"
    path.write_text(path.read_text().replace("0.2", "0.25", 1))
    assert check_results(results).findings == [
        f"{REL}/aligned/seed1/metrics.jsonl: contents differ from their sha256 in manifest.json"
    ]
