"""A benchmark file, a learnability case or seed, or the whole suite that has no data is a "not run" line
with the command that makes it: a gap never silently drops out of the report."""

from __future__ import annotations

import json

from audit_helpers import write_benchmark

from zeromismatch.audit.benchmarks import PRESET_ROLLOUTS, SECTIONS, benchmark_lines
from zeromismatch.audit.learnability import expected_runs, learnability_lines, missing_runs


def _learnability_run(root, case: str, seed: int, steps: int = 10, commit: str | None = None,
                      k3_max: float = 0.0) -> None:  # fmt: skip
    run = root / "reproduced" / "learnability" / case / f"seed{seed}"
    run.mkdir(parents=True)
    summary = {
        "eval_pass_at_1_before": 0.1, "eval_pass_at_1_after": 0.2,
        "eval_sampled_pass_at_1_before": 0.1, "eval_sampled_pass_at_1_after": 0.2,
        "reward_mean_first_fifth": 0.1, "reward_mean_last_fifth": 0.2, "k3_kl_max_over_steps": k3_max,
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    config = {"env": "tools", "model": "tiny-qwen3", "lag": 0, "kernels": "aligned", "steps": steps}
    config["seed"] = seed
    (run / "config.json").write_text(json.dumps(config))
    if commit is not None:
        (run / "provenance.json").write_text(json.dumps({"git_commit": commit}))


def test_seeds_of_different_configs_or_commits_are_not_averaged_into_a_verdict(tmp_path):
    # a re-run in progress left seeds of two commits (and configs) in one case: their mean is no result
    expected = {"alpha": (0, 1, 2), "beta": (0, 1, 2), "gamma": (0, 1, 2)}
    for seed in (0, 1, 2):
        _learnability_run(tmp_path, "alpha", seed, commit="a" * 40)
        _learnability_run(tmp_path, "beta", seed, commit="a" * 40 if seed else "b" * 40)
        _learnability_run(tmp_path, "gamma", seed, steps=7 if seed == 2 else 10, commit="a" * 40,
                          k3_max=float("nan") if seed == 1 else 0.0)  # fmt: skip
    lines = learnability_lines(tmp_path, expected)
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert rows["alpha"].endswith("| aaaaaaa | yes |")
    assert rows["beta"].endswith("| aaaaaaa, bbbbbbb | mixed runs: seeds differ in config or commit |")
    assert "mixed runs" in rows["gamma"] and "| nan |" in rows["gamma"]  # NaN wins the maximum


def test_learns_waits_for_the_suites_seeds_and_a_dirty_seed_is_another_commit(tmp_path):
    _learnability_run(tmp_path, "alpha", 0, commit="a" * 40)
    for seed in (0, 1):
        _learnability_run(tmp_path, "beta", seed, commit="a" * 40 + ("-dirty" if seed else ""))
    lines = learnability_lines(tmp_path, {"alpha": (0, 1, 2), "beta": (0, 1)})
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert rows["alpha"].endswith("| pending: 1 of 3 seeds |")
    assert rows["beta"].endswith("| aaaaaaa, aaaaaaa-dirty | mixed runs: seeds differ in config or commit |")


def test_every_absent_benchmark_file_is_a_not_run_line(tmp_path):
    text = "\n".join(benchmark_lines(tmp_path))
    assert "## Benchmarks" in text
    for name, _ in SECTIONS:
        assert f"- not run: `reproduced/benchmarks/{name}` (run: `" in text
    assert "--out results/reproduced/benchmarks/ops.json" in text


def test_a_present_benchmark_file_is_shown_and_only_the_others_are_not_run(tmp_path):
    write_benchmark(tmp_path, "async", {"async_over_sync": 1.8, "lag": 4})
    lines = benchmark_lines(tmp_path)
    text = "\n".join(lines)
    assert "Measured 1.80× at lag 4" in text
    not_run = [line for line in lines if line.startswith("- not run:")]
    # the sections, the other presets' rollouts, and every preset's step breakdown
    assert len(not_run) == len(SECTIONS) - 1 + len(PRESET_ROLLOUTS) + len(PRESET_ROLLOUTS) + 1
    assert not any("async.json" in line for line in not_run)


def test_missing_cases_and_seeds_are_listed_with_their_command(tmp_path):
    expected = {"alpha": (0, 1, 2), "beta": (0, 1)}
    _learnability_run(tmp_path, "alpha", 0)
    _learnability_run(tmp_path, "alpha", 2)
    assert missing_runs(tmp_path, expected) == [("alpha", [1]), ("beta", [0, 1])]
    text = "\n".join(learnability_lines(tmp_path, expected))
    assert "| alpha | tools |" in text
    assert "- not run: alpha seed 1 (run: `python scripts/learnability.py --cases alpha --seeds 1`)" in text
    assert "- not run: beta (every seed) (run: `python scripts/learnability.py --cases beta`)" in text


def test_a_run_still_being_written_is_not_counted(tmp_path):
    _learnability_run(tmp_path, "alpha", 0)
    (tmp_path / "reproduced" / "learnability" / "alpha" / "seed0" / "summary.json").unlink()
    assert missing_runs(tmp_path, {"alpha": (0,)}) == [("alpha", [0])]


def test_no_suite_at_all_is_one_not_run_line(tmp_path):
    text = "\n".join(learnability_lines(tmp_path))
    assert "## Learnability" in text
    assert "- not run: the whole learnability suite (run: `python scripts/learnability.py`)" in text


def test_the_expected_suite_is_the_one_the_suite_script_runs():
    from zeromismatch.experiment.learnability import SEEDS, cases

    assert expected_runs() == {case.name: tuple(SEEDS) for case in cases()}
