"""A run that cannot start writes nothing (no config.json, no directory it created) and does not block
its own --out; `zm train` turns a run's own failures into one line naming the file or flag, exit 2,
and whatever the run had already written stays as it was."""

from __future__ import annotations

import json

import pytest
from rl_helpers import tiny_config

from zeromismatch.cli import main
from zeromismatch.rl import actors, train
from zeromismatch.train import checkpoint as ck

TINY = ["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2",
        "--eval-samples", "1", "--quiet"]  # fmt: skip


def _zm_train(capsys, *flags: str) -> tuple[int, str]:
    code = main(["train", *TINY, *flags])
    err = capsys.readouterr().err
    if code == 2:
        assert err.startswith("zm train: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return code, err


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--model", "nope", "unknown model preset 'nope'"), ("--kernels", "nope", "unknown kernel set 'nope'"),
])  # fmt: skip
def test_a_failed_start_leaves_nothing_and_does_not_block_its_out(tmp_path, capsys, flag, value, says):
    out = tmp_path / "run"
    code, err = _zm_train(capsys, "--steps", "1", flag, value, "--out", str(out))
    assert code == 2 and says in err
    assert not out.exists()  # not even the directory the failed start had created
    assert _zm_train(capsys, "--steps", "1", "--out", str(out))[0] == 0  # the same --out, fixed flags
    assert (out / "config.json").exists() and (out / "summary.json").exists()


def test_a_failed_start_in_an_existing_directory_keeps_it(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _zm_train(capsys, "--steps", "1", "--model", "nope", "--out", str(out))[0] == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_an_empty_out_is_one_error(capsys):
    code, err = _zm_train(capsys, "--steps", "1", "--out", "")
    assert code == 2 and "--out is empty" in err


def test_an_unwritable_out_is_one_error_naming_it(capsys):
    code, err = _zm_train(capsys, "--steps", "1", "--out", "/proc/zm-no-such-dir/run")
    assert code == 2 and "/proc/zm-no-such-dir" in err


def test_the_ray_executor_checks_before_it_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(actors, "init_ray", lambda *a, **k: pytest.fail("started Ray for a bad config"))
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="unknown model preset"):
        train(tiny_config(executor="ray", model="nope"), out, quiet=True)
    assert not out.exists()


RESUMABLE = ("--steps", "2", "--checkpoint-every", "1")


@pytest.fixture
def run_dir(tmp_path, capsys):
    out = tmp_path / "run"
    assert _zm_train(capsys, *RESUMABLE, "--out", str(out))[0] == 0
    return out


def _files(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _truncate_state(latest):
    state = latest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])


def _bad_meta(latest):
    (latest / "meta.json").write_text("{oops")


def _bad_latest(latest):
    (latest.parent / ck.LATEST).write_text("not-a-step\n")


def _missing_state(latest):
    (latest / "state.pt").unlink()


def _no_optimizer(latest):
    # a well-formed, digest-verified checkpoint that is still no resumable training checkpoint
    loaded = ck.load_checkpoint(latest)
    state = {k: v for k, v in loaded.state.items() if k != "optimizer"}
    ck.save_checkpoint(latest.parent, loaded.step, state, {"config": loaded.meta["config"]})


@pytest.mark.parametrize(("damage", "says"), [
    (_truncate_state, "state.pt does not match the sha256"), (_bad_meta, "meta.json"),
    (_bad_latest, "LATEST names no checkpoint directory"), (_missing_state, "which has no state.pt"),
    (_no_optimizer, "state.pt has no optimizer"),
])  # fmt: skip
def test_a_bad_checkpoint_fails_the_resume_in_one_line_and_changes_nothing(run_dir, capsys, damage, says):
    damage(run_dir / "checkpoints" / "step_000002")
    before = _files(run_dir)
    code, err = _zm_train(capsys, *RESUMABLE, "--resume", "--out", str(run_dir))
    assert code == 2 and says in err, err
    assert _files(run_dir) == before  # provenance.json gained no restart, metrics.jsonl lost nothing


def _steps(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    real = ck._write_durably

    def full_at_step_2(path, data):
        if path.parent.name.startswith(".step_000002."):
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(ck, "_write_durably", full_at_step_2)
    out = tmp_path / "run"
    code, err = _zm_train(capsys, "--steps", "3", "--checkpoint-every", "1", "--out", str(out))
    assert code == 2 and "step_000002/state.pt" in err and "No space left on device" in err
    assert _steps(out) == [0, 1]
    assert ck.latest_checkpoint(out / "checkpoints").name == "step_000001"
    assert (out / "config.json").exists() and (out / "provenance.json").exists()
    assert not list((out / "checkpoints").glob(".step_*"))  # the failed save's temp dir is gone
    monkeypatch.setattr(ck, "_write_durably", real)  # space freed: the run resumes where it stood
    assert _zm_train(capsys, "--steps", "3", "--checkpoint-every", "1", "--resume", "--out", str(out))[0] == 0
    assert _steps(out) == [0, 1, 2]
