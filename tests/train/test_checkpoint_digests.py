"""Checkpoints are tamper-evident: meta.json records a sha256 of every file of the step (and of itself),
load_checkpoint verifies them and names the file that differs; a checkpoint without digests is refused
with what to do; LATEST must name a step directory; pruning can keep a step out of the count."""

from __future__ import annotations

import json

import pytest
import torch

from zeromismatch.train import checkpoint as ck


@pytest.fixture
def step_dir(tmp_path):
    return ck.save_checkpoint(tmp_path, 3, {"w": torch.arange(64, dtype=torch.float32)}, {"note": "n"})


def test_meta_records_the_state_digest(step_dir):
    import hashlib

    meta = json.loads((step_dir / "meta.json").read_text())
    digest = hashlib.sha256((step_dir / "state.pt").read_bytes()).hexdigest()
    assert meta["files_sha256"] == {"state.pt": digest}
    assert isinstance(meta["meta_sha256"], str)
    assert ck.load_checkpoint(step_dir).state["w"].sum() == sum(range(64))


def test_sixteen_flipped_bytes_in_state_are_refused(step_dir):
    """Inside the tensor's bytes torch.load itself notices nothing: without the digest this resumed
    with silently different weights."""
    state = step_dir / "state.pt"
    data = bytearray(state.read_bytes())
    at = data.find(torch.arange(64, dtype=torch.float32).numpy().tobytes()) + 16
    assert at >= 16
    data[at : at + 16] = bytes(b ^ 0xFF for b in data[at : at + 16])
    state.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match=r"state\.pt does not match the sha256"):
        ck.load_checkpoint(step_dir)


def test_an_edited_meta_is_refused(step_dir):
    meta_path = step_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["note"] = "edited"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ck.CheckpointError, match=r"meta\.json does not match the sha256"):
        ck.load_checkpoint(step_dir)


def test_a_checkpoint_without_digests_is_refused_with_what_to_do(step_dir, capsys):
    meta_path = step_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["files_sha256"], meta["meta_sha256"]
    meta_path.write_text(json.dumps(meta))  # as save_checkpoint wrote it before digests existed
    with pytest.raises(ck.CheckpointError, match="no file digests.*rerun from the start.*--add-digests"):
        ck.load_checkpoint(step_dir)
    # the escape hatch the message names, for files one trusts
    assert ck.main(["--add-digests", str(step_dir)]) == 0
    loaded = ck.load_checkpoint(step_dir)
    assert (loaded.step, loaded.meta["note"]) == (3, "n")


def test_a_listed_file_that_is_missing_is_incomplete(step_dir):
    (step_dir / "state.pt").unlink()
    with pytest.raises(ck.CheckpointError, match="incomplete.*state.pt is missing"):
        ck.load_checkpoint(step_dir)


def test_meta_may_not_set_the_digest_keys(tmp_path):
    with pytest.raises(ValueError, match="files_sha256"):
        ck.save_checkpoint(tmp_path, 1, {}, {"files_sha256": {}})


@pytest.mark.parametrize("pointer", ["", "garbage\n", "../elsewhere\n", "step_000003/../x\n"])
def test_latest_must_name_a_step_directory(step_dir, pointer):
    (step_dir.parent / ck.LATEST).write_text(pointer)
    with pytest.raises(ck.CheckpointError, match="LATEST names no checkpoint directory"):
        ck.latest_checkpoint(step_dir.parent)


def test_a_full_disk_while_saving_names_the_file_and_keeps_the_previous(step_dir, monkeypatch):
    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "_write_durably", full)
    with pytest.raises(OSError, match="No space left") as info:
        ck.save_checkpoint(step_dir.parent, 4, {"w": 1}, {})
    assert info.value.errno == 28 and info.value.filename.endswith("step_000004/state.pt")
    assert ck.latest_checkpoint(step_dir.parent) == step_dir
    assert sorted(p.name for p in step_dir.parent.iterdir()) == ["LATEST", "step_000003"]


def test_prune_keeps_the_always_kept_steps_outside_the_count(tmp_path):
    for step in range(5):
        ck.save_checkpoint(tmp_path, step, {"s": step}, {})
    ck.prune_checkpoints(tmp_path, keep=2, always_keep=(0,))
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000000", "step_000003", "step_000004"]
