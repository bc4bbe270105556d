"""The learnability suite: every case runs end to end at smoke size, room for a correct turn, the
report section is computed from the run files, bad input gets one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeromismatch.audit.learnability import case_rows, learnability_lines
from zeromismatch.experiment.learnability import cases, run_suite, select, smoke_cases
from zeromismatch.io import atomic_write_json

ROOT = Path(__file__).resolve().parents[2]


def test_every_env_and_both_async_lags_are_in_the_suite():
    suite = cases()
    assert {c.config.env for c in suite} == {"arithmetic", "tools", "code_repair", "desktop"}
    assert {c.config.lag for c in suite} >= {0, 8, 64}
    assert all(c.config.kernels == "aligned" and c.config.sft_steps > 0 for c in suite)
    assert len({c.name for c in suite}) == len(suite)


def test_cases_leave_room_for_a_correct_turn():
    from test_experiments import _longest_model_turn

    for case in cases():
        assert case.config.max_new_tokens >= _longest_model_turn(case.config.env, case.config.env_options), (
            case.name
        )


@pytest.mark.slow
def test_smoke_suite_runs_and_reports(tmp_path):
    chosen = select(["tools_lag8", "arithmetic"], smoke_cases())
    made = run_suite(chosen, seeds=(0, 1), out_root=tmp_path / "reproduced" / "learnability", quiet=True)
    assert sorted(made) == ["arithmetic", "tools_lag8"] and sorted(made["tools_lag8"]) == [0, 1]
    again = run_suite(chosen, seeds=(0, 1), out_root=tmp_path / "reproduced" / "learnability", quiet=True)
    assert again == {}  # finished runs are skipped
    rows = {r["case"]: r for r in case_rows(tmp_path)}
    assert rows["tools_lag8"]["lag"] == 8 and rows["tools_lag8"]["seeds"] == [0, 1]
    assert rows["arithmetic"]["k3_kl_max"] == 0.0
    text = "\n".join(learnability_lines(tmp_path))
    assert "## Learnability" in text and "| tools_lag8 | tools | tiny-qwen3 | 8 |" in text


def _fake_run(root: Path, case: str, seed: int, before: float, after: float) -> None:
    run = root / "reproduced" / "learnability" / case / f"seed{seed}"
    summary = {
        "eval_pass_at_1_before": before, "eval_pass_at_1_after": after,
        "eval_sampled_pass_at_1_before": before, "eval_sampled_pass_at_1_after": after,
        "reward_mean_first_fifth": 0.1, "reward_mean_last_fifth": 0.2, "k3_kl_max_over_steps": 0.0,
    }  # fmt: skip
    atomic_write_json(run / "summary.json", summary)
    config = {"env": "tools", "model": "tiny-qwen3", "lag": 0, "kernels": "aligned", "steps": 10}
    config["seed"] = seed
    atomic_write_json(run / "config.json", config)


def test_learns_needs_the_mean_and_a_majority_of_seeds(tmp_path):
    for seed, (b, a) in enumerate([(0.2, 0.9), (0.3, 0.2), (0.3, 0.25)]):  # mean up, but 1 of 3 seeds
        _fake_run(tmp_path, "lucky", seed, b, a)
    for seed, (b, a) in enumerate([(0.2, 0.3), (0.3, 0.35), (0.3, 0.25)]):
        _fake_run(tmp_path, "steady", seed, b, a)
    rows = {r["case"]: r for r in case_rows(tmp_path)}
    assert rows["lucky"]["raised_in"] == 1 and rows["lucky"]["learns"] is False
    assert rows["steady"]["raised_in"] == 2 and rows["steady"]["learns"] is True
    assert rows["steady"]["sampled"] == [(0.2, 0.3), (0.3, 0.35), (0.3, 0.25)]
    assert "| 0.267 → 0.300 | 0.20→0.30, 0.30→0.35, 0.30→0.25 | 2/3 |" in "\n".join(
        learnability_lines(tmp_path)
    )


def test_a_run_without_sampled_pass_at_1_is_one_clear_error(tmp_path):
    from zeromismatch.audit import AuditInputError

    _fake_run(tmp_path, "greedy_only", 0, 0.1, 0.2)
    path = tmp_path / "reproduced" / "learnability" / "greedy_only" / "seed0" / "summary.json"
    summary = json.loads(path.read_text())
    summary["eval_sampled_pass_at_1_after"] = None  # what summarize() writes when eval_samples == 0
    atomic_write_json(path, summary)
    with pytest.raises(AuditInputError, match="greedy_only/seed0/summary.json: no sampled pass@1"):
        case_rows(tmp_path)


def test_no_runs_no_table_only_a_not_run_line(tmp_path):
    lines = learnability_lines(tmp_path)
    assert not any(line.startswith("|") for line in lines)
    assert [line for line in lines if line.startswith("- not run:")] == [
        "- not run: the whole learnability suite (run: `python scripts/learnability.py`)"
    ]


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown learnability case\(s\) \['nope'\]"):
        select(["nope"], cases())
    with pytest.raises(ValueError, match="seeds must be distinct"):
        run_suite(cases()[:1], seeds=(1, 1), out_root=tmp_path)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "learnability.py"), "--cases", "nope", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "unknown learnability case(s) ['nope']" in out.stderr


def test_out_root_that_is_a_file_is_one_clear_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("hi")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "learnability.py"), "--out-root", str(afile), "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "is not a directory" in out.stderr and "Traceback" not in out.stderr


def test_corrupt_summary_names_the_file(tmp_path):
    _fake_run(tmp_path, "broken", 0, 0.1, 0.2)
    (tmp_path / "reproduced" / "learnability" / "broken" / "seed0" / "summary.json").write_text("{not json")
    from zeromismatch.audit import AuditInputError

    with pytest.raises(AuditInputError, match="summary.json"):
        case_rows(tmp_path)
    assert json.loads(
        (tmp_path / "reproduced" / "learnability" / "broken" / "seed0" / "config.json").read_text()
    )
