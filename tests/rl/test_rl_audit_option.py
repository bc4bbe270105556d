"""``audit_rollout_version=False`` skips only the learner's re-scoring at the rollout's weight
version (a throughput option): training is bit-identical, and the metrics that need the
re-scoring are reported as NaN instead of silently mixing weight lag into the kernel term."""

from __future__ import annotations

import math

import pytest
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train


def test_skipping_the_audit_changes_no_weight_and_reports_nan_not_a_wrong_number(tmp_path):
    audited = train(tiny_config(steps=4, lag=2), tmp_path / "audited", quiet=True)
    unaudited = tiny_config(steps=4, lag=2, audit_rollout_version=False)
    skipped = train(unaudited, tmp_path / "skipped", quiet=True)
    assert skipped["weights_sha256"] == audited["weights_sha256"]
    audited_records = read_metrics(tmp_path / "audited")
    assert any(r["policy_lag"] > 0 for r in audited_records)  # else the lagged branch below never runs
    for with_audit, without in zip(audited_records, read_metrics(tmp_path / "skipped")):
        assert with_audit["loss"] == without["loss"] and with_audit["reward_mean"] == without["reward_mean"]
        lagged = with_audit["policy_lag"] > 0
        unreported = ("diff_max", "k3_kl", "kernel_diff_max", "gap_kernel_abs_max", "entropy")
        for key in (*unreported, "kernel_out_of_support_tokens"):
            assert math.isnan(without[key]) == lagged, key
            if lagged:
                assert not math.isnan(with_audit[key]), key  # measured when audited (aligned: exactly 0)
        if lagged:
            assert with_audit["diff_max"] == 0.0 and with_audit["gap_kernel_abs_max"] == 0.0


def test_audit_option_must_be_a_bool():
    with pytest.raises(ValueError, match="audit_rollout_version"):
        tiny_config(audit_rollout_version="no")
