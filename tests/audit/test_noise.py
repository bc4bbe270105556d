"""min_z: a difference of means over per-step values must clear its standard error (Welch) before
it counts as a direction; the z is reported either way. Step values here are made up; each
expected z is computed by hand from them (statistics module, independent of the audit's numpy)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from audit_helpers import write_run

from zeromismatch.audit.registry import AuditInputError, load_registry
from zeromismatch.audit.verdicts import NOT_REPRODUCED, REPRODUCED_DIRECTION, evaluate_all

OSW = "S3-osworld-step-time-944.25-vs-884.17"
REWARD = "S3-qwen3-4b-lag64-reward-0.287-to-0.78"


def _verdict(results, experiment, claim_id):
    return {v.claim_id: v for v in evaluate_all(load_registry(results), results, experiment)}[claim_id]


def _welch_z(lhs: list[float], rhs: list[float]) -> float:
    error = math.sqrt(statistics.variance(lhs) / len(lhs) + statistics.variance(rhs) / len(rhs))
    return (statistics.fmean(lhs) - statistics.fmean(rhs)) / error


def _step_times(results, aligned: list[float], default: list[float]) -> None:
    records = [
        {"step": s, "aligned.time_rollout_s": a, "aligned.time_learner_s": 0.0,
         "default.time_rollout_s": d, "default.time_learner_s": 0.0}
        for s, (a, d) in enumerate(zip(aligned, default, strict=True))
    ]  # fmt: skip
    write_run(results, "osworld_step_time", "mini", "r", records=records)


def test_published_rules_carry_the_noise_floor():
    from audit_helpers import REPO

    claims = load_registry(REPO / "results").by_id()
    assert claims[OSW]["test"]["checks"][0]["min_z"] == 2.0
    assert claims[REWARD]["test"]["checks"][0]["min_z"] == 2.0


def test_step_time_difference_within_noise_is_not_reproduced(results):
    default = [1.0, 1.4] * 6
    aligned = [t + 0.01 for t in default]  # larger mean, as in the reviewed run (ratio ~1.008)
    _step_times(results, aligned, default)
    verdict = _verdict(results, "osworld_step_time", OSW)
    expected = _welch_z(aligned, default)
    assert 0 < expected < 2
    assert verdict.verdict == NOT_REPRODUCED, verdict.reason
    assert "the difference is within noise (z = " in verdict.reason and "needs z >= 2" in verdict.reason
    (z,) = [m for m in verdict.measured if m.label.startswith("z, ")]
    assert z.passed is None and z.value == pytest.approx(expected, rel=1e-12)
    assert "(Welch, 12 vs 12 steps as samples)" in z.source


def test_clear_step_time_difference_is_reproduced_and_reports_its_z(results):
    default = [1.0, 1.4] * 6
    aligned = [t + 0.5 for t in default]
    _step_times(results, aligned, default)
    verdict = _verdict(results, "osworld_step_time", OSW)
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason
    expected = _welch_z(aligned, default)
    assert expected > 2
    assert f"z = {expected:.4g}" in verdict.reason


def _tool_rewards(results, rewards: list[float]) -> None:
    records = [{"step": s, "reward_mean": r} for s, r in enumerate(rewards)]
    write_run(results, "reinforce_zero_lag64", "mini", "tools_aligned", records=records)


def test_reward_tail_barely_above_head_is_not_reproduced(results):
    rewards = [0.1, 0.3] * 2 + [0.2] * 32 + [0.12, 0.32] * 2  # 40 steps: 4-step windows
    _tool_rewards(results, rewards)
    verdict = _verdict(results, "reinforce_zero_lag64", REWARD)
    assert verdict.verdict == NOT_REPRODUCED, verdict.reason
    expected = _welch_z(rewards[-4:], rewards[:4])
    assert f"z = {expected:.4g}" in verdict.reason and "(Welch, 4 vs 4 steps" in verdict.reason


def test_reward_rising_well_beyond_noise_is_reproduced(results):
    rewards = [0.1 + 0.02 * s + (0.01 if s % 2 else -0.01) for s in range(40)]
    _tool_rewards(results, rewards)
    verdict = _verdict(results, "reinforce_zero_lag64", REWARD)
    assert verdict.verdict == REPRODUCED_DIRECTION, verdict.reason
    assert f"z = {_welch_z(rewards[-4:], rewards[:4]):.4g}" in verdict.reason


def test_a_reversed_difference_reports_its_z_too(results):
    default = [1.0, 1.4] * 6
    aligned = [t - 0.3 for t in default]  # aligned faster: the claimed direction is reversed
    _step_times(results, aligned, default)
    verdict = _verdict(results, "osworld_step_time", OSW)
    assert verdict.verdict == NOT_REPRODUCED
    assert "is not >= " in verdict.reason and f"(z = {_welch_z(aligned, default):.4g}: " in verdict.reason


def test_one_step_per_window_cannot_show_a_direction(results):
    _tool_rewards(results, [0.1, 0.9])  # windows of one step: no standard error
    verdict = _verdict(results, "reinforce_zero_lag64", REWARD)
    assert verdict.verdict == NOT_REPRODUCED
    assert "z undefined: needs at least 2 steps on each side, has 1 and 1" in verdict.reason


def _rewrite(results, experiment, change):
    path = results / "published" / f"{experiment}.json"
    doc = json.loads(path.read_text())
    change(doc["claims"][0]["test"]["checks"][0])
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(op="=="), "min_z but op '=='"),
        (lambda c: c["lhs"].update(agg="max"), "its lhs is not a mean of a metrics series"),
        (lambda c: c["rhs"].update(abs_dev_from=1.0), "its rhs is not a mean of a metrics series"),
        (lambda c: c.update(rhs=1.0), "its rhs is not a mean of a metrics series"),
        (lambda c: c.update(min_z=0), "min_z"),  # the schema: exclusiveMinimum 0
    ],
)
def test_min_z_needs_means_of_series_and_a_direction(results, change, message):
    _rewrite(results, "osworld_step_time", change)
    with pytest.raises(AuditInputError, match=message):
        load_registry(results)
