"""benchmarks/{ops,rollout,async}.py: bad arguments exit 2 with one message before any work."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}_args", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("ops", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("ops", ["--threads", "-2"], "--threads: must be >= 0"),
        ("rollout", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("rollout", ["--batch", "0"], "--batch: must be >= 1"),
        ("rollout", ["--new-tokens", "0"], "--new-tokens: must be >= 1"),
        ("rollout", ["--threads", "-2"], "--threads: must be >= 1"),
        ("rollout", ["--model", "nope"], "unknown --model 'nope'"),
        ("async", ["--steps", "0"], "--steps: must be >= 1"),
        ("async", ["--lag", "-1"], "--lag: must be >= 1"),
        ("async", ["--repeats", "two"], "expected an integer"),
        ("async", ["--model", "nope"], "unknown --model 'nope'"),
    ],
)
def test_bad_arguments_exit_two_before_any_work(name, args, message, capsys, monkeypatch):
    module = _load(name)
    for heavy in ("dense_cases", "build_preset"):  # the first real work each script does
        if hasattr(module, heavy):
            monkeypatch.setattr(module, heavy, lambda *a, **k: pytest.fail("started work"))
    monkeypatch.setitem(sys.modules, "ray", None)  # async.py: importing ray would be the first work
    with pytest.raises(SystemExit) as exit_info:
        module.main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err
    assert err.count("error:") == 1
