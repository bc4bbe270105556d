"""``zm train --out`` under an existing file is one clear error before any work."""

from __future__ import annotations

import pytest

import zeromismatch.rl
from zeromismatch.cli import main


def test_train_out_under_a_file_fails_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(zeromismatch.rl, "train", lambda *a, **k: pytest.fail("started the run"))
    afile = tmp_path / "afile"
    afile.write_text("hi")
    assert main(["train", "--steps", "1", "--quiet", "--out", str(afile / "run")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("zm train: --out") and captured.err.count("\n") == 1
    assert afile.read_text() == "hi"
