"""experiments/<name>/figures.py: a bad results directory is one line on stderr and exit 2, as
paper_figures/make_all.py does, not a traceback."""

from __future__ import annotations

from zeromismatch.audit.report import experiment_figures_main


def test_bad_results_dir_is_one_line_and_exit_two(tmp_path, capsys):
    assert experiment_figures_main("reinforce_zero_lag64", ["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforce_zero_lag64/figures.py: ") and "published" in err
    assert len(err.strip().splitlines()) == 1


def test_curves_name_the_steps_they_cannot_draw(tmp_path):
    # an inf step (a token the trainer gives probability 0) was dropped from the curve without a word
    import math

    from audit_helpers import write_run

    from zeromismatch.audit.figures import _curve_frame
    from zeromismatch.audit.runs import DataDir

    records = [{"step": i, "k3_kl": 1e-9} for i in range(5)]
    records[3]["k3_kl"] = math.inf
    run = write_run(tmp_path, "x", "mini", "default", records=records)
    drawn, nonfinite = _curve_frame([("default", DataDir(tmp_path, run))])
    assert len(drawn) == 4 and nonfinite["step"].tolist() == [3]


def test_the_training_solved_rate_is_drawn_as_a_five_step_rolling_mean(tmp_path):
    from audit_helpers import write_run

    from zeromismatch.audit.figures import _curve_frame
    from zeromismatch.audit.runs import DataDir

    records = [{"step": i, "solved_rate": float(i), "reward_mean": float(i)} for i in range(8)]
    run = write_run(tmp_path, "x", "mini", "fast", records=records)
    drawn, _ = _curve_frame([("fast", DataDir(tmp_path, run))])
    solved = drawn[drawn["metric"] == "solved_rate"]["value"].tolist()
    assert solved == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0]  # trailing mean of up to 5 steps
    assert drawn[drawn["metric"] == "reward_mean"]["value"].tolist() == [float(i) for i in range(8)]
