"""`make test` (README's test command, which .ci/run runs verbatim): pytest collecting no tests
(its exit 5) is named by the recipe, because make turns every failing recipe into exit 2 and a caller
of make can no longer tell. The recipe is run with stand-in lint tools, pytest and vLLM-venv python;
nothing is installed."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fake_venv(tmp_path: Path, pytest_rc: int) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    lint = ("ruff", "mypy", "codespell", "clang-format")  # `make lint`, which `make test` runs first
    for tool, rc in (*((name, 0) for name in lint), ("pytest", pytest_rc)):
        script = venv / "bin" / tool
        script.write_text(f"#!/bin/sh\nexit {rc}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    # the Makefile's install stamp, so `venv` is up to date and nothing is installed
    digest = hashlib.sha256((ROOT / "constraints.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes())
    (venv / f".installed-{digest.hexdigest()[:12]}").touch()
    return venv


def _fake_vllm_venv(tmp_path: Path) -> Path:
    """The vLLM venv `make test` runs the plugin's tests in: a python that exits 0, and its stamp."""
    venv = tmp_path / "venv-vllm"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (venv / ".installed").touch()  # newer than pyproject.toml: nothing is installed
    return venv


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("pytest_rc, named", [(5, True), (1, False), (0, False)])
def test_make_test_names_pytest_collecting_nothing(tmp_path, pytest_rc, named):
    venv, vllm_venv = _fake_venv(tmp_path, pytest_rc), _fake_vllm_venv(tmp_path)
    out = subprocess.run(
        ["make", "-s", "test", f"VENV={venv}", f"VLLM_VENV={vllm_venv}"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""},
    )  # fmt: skip
    assert (out.returncode == 0) == (pytest_rc == 0), out.stderr
    assert ("pytest collected no tests" in out.stderr) == named, out.stderr


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^make test\b", readme, re.MULTILINE)
    assert command, "README.md gives `make test` as the test command"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci_lines
    assert not any("-eq 5" in line for line in ci_lines)  # dead after make: it never sees pytest's 5
