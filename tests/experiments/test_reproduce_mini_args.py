"""scripts/reproduce_mini.py: a bad --only is one error (exit 2) before anything runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reproduce_mini(monkeypatch):
    path = ROOT / "scripts" / "reproduce_mini.py"
    spec = importlib.util.spec_from_file_location("reproduce_mini_args", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran = []
    monkeypatch.setattr(module.subprocess, "run", lambda cmd, cwd=None: ran.append(cmd) or pytest.fail("ran"))
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
        assert "reinforce_zero_lag64" in err and "osworld_step_time" in err


def test_known_only_runs_just_that_launcher_without_suites(reproduce_mini, monkeypatch):
    module, _ = reproduce_mini
    ran = []

    class Done:
        returncode = 0

    monkeypatch.setattr(module.subprocess, "run", lambda cmd, cwd=None: ran.append(cmd) or Done())
    assert module.main(["--only", "osworld_step_time", "--quiet"]) == 0
    (cmd,) = ran
    assert cmd[1].endswith("experiments/osworld_step_time/launch.py") and "--quiet" in cmd
