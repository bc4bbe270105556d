"""Smoke runs of every env x algorithm, and the zero-mismatch property inside the loop."""

from __future__ import annotations

import json
import math

import pytest
from rl_helpers import read_metrics, tiny_config

from zeromismatch.envs import ENVS
from zeromismatch.rl import ALGOS, train


@pytest.mark.parametrize("env", sorted(ENVS))
@pytest.mark.parametrize("algo", ALGOS)
def test_every_env_and_algo_runs(tmp_path, env, algo):
    config = tiny_config(env=env, algo=algo, steps=1, max_new_tokens=6 if env != "arithmetic" else 4)
    summary = train(config, tmp_path / "run", quiet=True)
    assert summary["steps"] == 1
    (record,) = read_metrics(tmp_path / "run")
    assert math.isfinite(record["loss"])
    assert record["tokens"] > 0
    for name in ("metrics.jsonl", "summary.json", "provenance.json", "config.json"):
        assert (tmp_path / "run" / name).exists()
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["packages"]["torch"].startswith("2.13.0")


def test_aligned_stack_has_zero_mismatch_and_unit_is_weights_at_lag_0(tmp_path):
    train(tiny_config(steps=3, temperature=1.0, top_p=0.9), tmp_path / "run", quiet=True)
    for record in read_metrics(tmp_path / "run"):
        assert record["policy_lag"] == 0
        for key in ("diff_max", "diff_mean", "diff_std", "k3_kl"):
            assert record[key] == 0.0, (key, record)
        assert record["is_max"] == 1.0 and record["is_min"] == 1.0
        assert record["peak_over_median"] == 1.0


@pytest.mark.native
def test_aligned_native_stack_has_zero_mismatch_at_lag(tmp_path):
    """The RL loop on the aligned-native set (C attention, scan and GEMMs on both sides), lagged: the
    kernel term of every step is exactly zero, as on the pure-torch aligned stack."""
    config = tiny_config(steps=3, lag=1, kernels="aligned-native", temperature=1.0, top_p=0.9)
    train(config, tmp_path / "run", quiet=True)
    for record in read_metrics(tmp_path / "run"):
        assert record["diff_max"] == 0.0 and record["k3_kl"] == 0.0, record
        assert record["gap_kernel_abs_max"] == 0.0
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["numerics"]["native_builds"]  # the compiler and flags behind these bits


def test_default_rollout_kernels_show_mismatch(tmp_path):
    """Inverse: the same run with the engine on default kernels (bf16-free, fp32) is not zero."""
    train(tiny_config(steps=2, rollout_kernels="default"), tmp_path / "run", quiet=True)
    records = read_metrics(tmp_path / "run")
    assert any(r["diff_max"] > 0.0 and r["k3_kl"] > 0.0 for r in records)
    assert any(r["peak_over_median"] != 1.0 for r in records)


@pytest.mark.parametrize("lag", [1, 3])
def test_async_lag_schedule_and_kernel_term_stays_zero(tmp_path, lag):
    # a short warm start on single-digit sums makes some rewards nonzero, so the weights move
    config = tiny_config(steps=4, lag=lag, sft_steps=20, prompts_per_step=4, group_size=4,
                         env_options={"max_digits": 1})  # fmt: skip
    train(config, tmp_path / "run", quiet=True)
    records = read_metrics(tmp_path / "run")
    assert [r["policy_lag"] for r in records] == [min(s, lag) for s in range(4)]
    for record in records:
        # weight lag may move the IS weights; the kernel term must stay exactly zero
        assert record["gap_kernel_abs_max"] == 0.0
        assert record["diff_max"] == 0.0
    # once an update has changed the weights, a lagged batch shows a nonzero weight-lag term
    moved = [i for i, r in enumerate(records) if r["grad_norm_preclip"] > 0]
    lagged_after_move = [r for r in records if moved and r["step"] > moved[0] and r["policy_lag"] > 0]
    assert moved, "no update changed the weights; the test config no longer produces rewards"
    assert lagged_after_move, "no lagged batch after the first weight change: the next check would be vacuous"
    assert all(r["gap_weight_lag_abs_max"] > 0.0 for r in lagged_after_move)


def test_existing_run_dir_is_refused(tmp_path):
    train(tiny_config(steps=1), tmp_path / "run", quiet=True)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(tiny_config(steps=1), tmp_path / "run", quiet=True)
