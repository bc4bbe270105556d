"""An output path that could not be written is refused before any work, in one line naming the flag.

``zm bisect --out``, ``zm invariance --out``, ``zm train --out`` and ``paper_figures/make_all.py
--results``: a directory that is not writable (tried, not read from mode bits, so it holds for root
too), a file where a directory must go, or a directory where a file must go. Each case fails the
work function if it is reached, so "before any work" is checked, not assumed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from zeromismatch.cli import main

REPO = Path(__file__).resolve().parents[1]


def _writable(directory: Path) -> bool:
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError:
        return False
    return True


@pytest.fixture
def unwritable(tmp_path):
    """A directory nothing can be created in: mode 0555, plus the immutable attribute where mode bits
    do not bind (root); skipped where neither works."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    (directory / "kept.txt").write_text("already here\n")
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    immutable = False
    if _writable(directory) and shutil.which("chattr"):
        immutable = subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0
    try:
        if _writable(directory):
            pytest.skip("cannot make a directory unwritable here (root without chattr +i)")
        yield directory
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)
    assert (directory / "kept.txt").read_text() == "already here\n"


def _one_line_naming(err: str, prefix: str) -> None:
    assert err.startswith(prefix) and err.count("\n") == 1, err


BISECT = ["bisect", "--model", "tiny-qwen3", "--rollout-kernels", "aligned", "--trainer-kernels", "aligned"]


def test_bisect_refuses_an_unwritable_out_before_bisecting(unwritable, monkeypatch, capsys):
    import zeromismatch.bisect.report as report

    monkeypatch.setattr(report, "run_bisect", lambda *a, **k: pytest.fail("bisected first"))
    assert main([*BISECT, "--out", str(unwritable / "repro")]) == 2
    _one_line_naming(capsys.readouterr().err, f"zm bisect: --out {unwritable / 'repro'}: cannot write in")


def test_invariance_refuses_an_unwritable_out_before_measuring(unwritable, monkeypatch, capsys):
    import zeromismatch.kernels.selfcheck as selfcheck

    monkeypatch.setattr(selfcheck, "run_checks", lambda *a, **k: pytest.fail("measured first"))
    for out in (unwritable / "node.json", unwritable / "new" / "node.json"):
        assert main(["invariance", "--out", str(out)]) == 2
        _one_line_naming(capsys.readouterr().err, f"zm invariance: --out {out.parent}: cannot write in")


def test_train_refuses_an_unwritable_out_before_training(unwritable, monkeypatch, capsys):
    import zeromismatch.rl as rl

    monkeypatch.setattr(rl, "train", lambda *a, **k: pytest.fail("trained first"))
    assert main(["train", "--steps", "1", "--out", str(unwritable / "run")]) == 2
    _one_line_naming(capsys.readouterr().err, f"zm train: --out {unwritable / 'run'}: cannot write in")


def _make_all():
    spec = importlib.util.spec_from_file_location("make_all", REPO / "paper_figures" / "make_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_build(monkeypatch):
    import zeromismatch.audit as audit

    monkeypatch.setattr(audit, "build_all", lambda *a, **k: pytest.fail("read the inputs and drew first"))


def test_make_all_refuses_unwritable_results_before_building(unwritable, no_build, capsys):
    assert _make_all().main(["--results", str(unwritable), "--quiet"]) == 2
    _one_line_naming(capsys.readouterr().err, f"make_all: --results {unwritable}: cannot write in")


@pytest.mark.parametrize(
    ("blocked", "message"),
    [("REPORT.md", "is a directory"), ("verdicts.json", "is a directory"), ("figures", "is not a directory")],
)
def test_make_all_refuses_an_output_it_could_not_replace(tmp_path, no_build, capsys, blocked, message):
    # publishing replaces the outputs one by one: failing at REPORT.md would have left new verdicts
    # and an old report side by side
    results = tmp_path / "results"
    results.mkdir()
    (results / "verdicts.json").write_text("{}\n")
    if blocked == "figures":
        (results / blocked).write_text("a file\n")
    else:
        (results / blocked).unlink(missing_ok=True)
        (results / blocked).mkdir()
    assert _make_all().main(["--results", str(results), "--quiet"]) == 2
    err = capsys.readouterr().err
    _one_line_naming(err, "make_all: --results ")
    assert message in err and blocked in err
    assert sorted(os.listdir(results)) == sorted({"verdicts.json", blocked})
