"""experiments/<name>/figures.py: a bad results directory is one line on stderr and exit 2, as
paper_figures/make_all.py does, not a traceback."""

from __future__ import annotations

from zeromismatch.audit.report import experiment_figures_main


def test_bad_results_dir_is_one_line_and_exit_two(tmp_path, capsys):
    assert experiment_figures_main("reinforce_zero_lag64", ["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforce_zero_lag64/figures.py: ") and "published" in err
    assert len(err.strip().splitlines()) == 1
