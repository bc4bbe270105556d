"""``keep_checkpoints`` (``zm train --keep-checkpoints``): only the newest N checkpoints stay on disk
(0 keeps all), and the warm start step_000000 -- what `zm parity --checkpoint` measures -- always stays."""

from __future__ import annotations

import json

import pytest
from rl_helpers import tiny_config

import zeromismatch.rl
from zeromismatch.cli import main
from zeromismatch.rl import RLConfig, train


def _steps(out) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step_*"))


def test_only_the_newest_are_kept_besides_the_warm_start(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(steps=4, checkpoint_every=1), out, quiet=True)  # default keep_checkpoints=2
    assert _steps(out) == ["step_000000", "step_000003", "step_000004"]


def test_zero_keeps_every_checkpoint(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(steps=3, checkpoint_every=1, keep_checkpoints=0), out, quiet=True)
    assert _steps(out) == ["step_000000", "step_000001", "step_000002", "step_000003"]


def test_a_resume_may_change_how_many_are_kept(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(steps=2, checkpoint_every=1, keep_checkpoints=0), out, quiet=True)
    train(tiny_config(steps=2, checkpoint_every=1, keep_checkpoints=1), out, resume=True, quiet=True)
    assert json.loads((out / "config.json").read_text())["keep_checkpoints"] == 1


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_keep_checkpoints_is_a_non_negative_int(value):
    with pytest.raises(ValueError, match="RLConfig.keep_checkpoints: must be a non-negative int"):
        RLConfig(keep_checkpoints=value)


def test_the_flag_reaches_the_config(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(zeromismatch.rl, "train", lambda config, *a, **k: seen.setdefault("c", config) and {})
    main(["train", "--steps", "1", "--keep-checkpoints", "5", "--quiet", "--out", str(tmp_path / "run")])
    assert seen["c"].keep_checkpoints == 5
