"""provenance.json is appended per (re)start, never overwritten: the first start's record stays at the
top level (what the audit reads) and each resume adds one record to ``restarts``; a failed resume adds
nothing."""

from __future__ import annotations

import json

import pytest
from rl_helpers import tiny_config

from zeromismatch.rl import train
from zeromismatch.train import checkpoint as ck


def _provenance(out) -> dict:
    return json.loads((out / "provenance.json").read_text())


def test_each_resume_appends_a_restart_and_keeps_the_first_record(tmp_path):
    out = tmp_path / "run"
    config = tiny_config(steps=2, checkpoint_every=1)
    train(config, out, quiet=True)
    first = _provenance(out)
    assert "restarts" not in first
    train(config, out, resume=True, quiet=True)
    train(config, out, resume=True, quiet=True)
    now = _provenance(out)
    assert {k: v for k, v in now.items() if k != "restarts"} == first  # git_commit, config_hash, ... kept
    assert [r["resumed_at_step"] for r in now["restarts"]] == [2, 2]
    for record in now["restarts"]:
        assert record["resumed_from"].endswith("step_000002")
        assert record["git_commit"] and record["config_hash"] == first["config_hash"] and record["started_at"]


def test_a_failed_resume_adds_nothing(tmp_path):
    out = tmp_path / "run"
    config = tiny_config(steps=1, checkpoint_every=1)
    train(config, out, quiet=True)
    before = (out / "provenance.json").read_bytes()
    (out / "checkpoints" / "step_000001" / "state.pt").write_bytes(b"corrupt")
    with pytest.raises(ck.CheckpointError):
        train(config, out, resume=True, quiet=True)
    assert (out / "provenance.json").read_bytes() == before


def test_the_audit_reads_a_restarted_run_as_it_read_the_first_start(tmp_path):
    from zeromismatch.audit.runs import DataDir

    out = tmp_path / "run"
    config = tiny_config(steps=1, checkpoint_every=1)
    train(config, out, quiet=True)
    first = _provenance(out)
    train(config, out, resume=True, quiet=True)
    data = DataDir(tmp_path, out)
    assert data.provenance["git_commit"] == first["git_commit"]
    assert data.provenance["config_hash"] == first["config_hash"]
