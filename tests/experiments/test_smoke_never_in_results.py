"""Smoke runs check plumbing: they go to runs/smoke/ (or the --out-root), never under a results/ that
the audit judges and ``make reproduce`` verifies."""

from __future__ import annotations

import pytest
from experiment_helpers import ROOT, load, make_checkout

from zeromismatch.experiment import runner


def test_the_default_smoke_root_is_runs_smoke_of_the_configs_checkout():
    experiment = load("osworld_step_time")
    assert runner.default_out_root(experiment, "smoke") == ROOT / "runs" / "smoke"
    assert runner.default_out_root(experiment, "mini") == ROOT / "results" / "reproduced"
    assert runner.default_out_root(experiment, "full") == ROOT / "runs"


def test_a_smoke_out_root_inside_results_is_refused_before_anything_runs(tmp_path, monkeypatch):
    other = make_checkout(tmp_path / "other", ("experiments/osworld_step_time", "results/published"))
    monkeypatch.setattr(runner, "run_arm", lambda *a, **k: pytest.fail("trained"))
    for inside in (other / "results" / "reproduced", other / "results", other / "results" / "x" / "y"):
        with pytest.raises(ValueError, match="smoke runs never go there"):
            runner.run_experiment(load("osworld_step_time"), "smoke", out_root=inside, quiet=True)
    assert sorted(p.name for p in (other / "results").iterdir()) == ["published"]
    code = runner.launch_main(
        load("osworld_step_time"), ["--scale", "smoke", "--out-root", str(other / "results")]
    )
    assert code == 2


def test_smoke_runs_land_under_the_given_out_root(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(runner, "run_arm", lambda arm, final, quiet: made.append(final) or {})
    experiment = load("osworld_step_time")
    runner.run_experiment(experiment, "smoke", out_root=tmp_path / "smoke", quiet=True)
    arms = [arm.name for arm in experiment.arms_for("smoke")]
    assert made == [str(tmp_path / "smoke" / experiment.name / "smoke" / arm) for arm in arms]
