"""scripts/reproduce_mini.py: a bad --only is one error (exit 2) before anything runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reproduce_mini(monkeypatch):
    path = ROOT / "scripts" / "reproduce_mini.py"
    spec = importlib.util.spec_from_file_location("reproduce_mini_args", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    ran = []
    monkeypatch.setattr(module, "run_step", lambda step, *a, **k: ran.append(step) or pytest.fail("ran"))
    monkeypatch.setattr(module, "settings", lambda root: {"env": {}, "torch": "t", "torch_threads": 1,
                                                          "python": "3", "cpu": "c", "git_commit": "g",
                                                          "checkout": str(root)})  # fmt: skip
    return module, ran


BAD_ONLY = [["--only", "reinforce_zero_lag46"], ["--only"], ["--only", "x", "osworld_step_time"]]


@pytest.mark.parametrize("argv", BAD_ONLY)
def test_bad_only_exits_two_naming_the_known_experiments(reproduce_mini, argv, capsys):
    module, ran = reproduce_mini
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("error:") == 1 and ran == []
    if len(argv) > 1:
        assert "reinforce_zero_lag64" in err and "osworld_step_time" in err and "learnability" in err


def test_known_only_runs_just_that_launcher_without_suites(reproduce_mini, monkeypatch, tmp_path, capsys):
    module, _ = reproduce_mini
    ran = []
    monkeypatch.setattr(module, "run_step", lambda step, cwd, log, poll: ran.append(step) or 0)
    # nothing was rerun, so the committed runs are missing from the fresh directory: exit 1
    assert module.main(["--only", "osworld_step_time", "--quiet", "--out", str(tmp_path / "fresh")]) == 1
    (step,) = ran
    assert step.argv[1].endswith("experiments/osworld_step_time/launch.py") and "--quiet" in step.argv
    assert step.argv[step.argv.index("--out-root") + 1] == str(tmp_path / "fresh")
    out = capsys.readouterr().out
    assert "osworld_step_time/mini/aligned" in out and "missing (committed, not rerun)" in out
