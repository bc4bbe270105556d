"""Atomic, resumable training checkpoints.

A checkpoint is a directory ``<root>/step_<N>/`` holding everything a run needs
to continue bit for bit: model weights, optimizer state, every RNG state
(python, numpy, torch), the data cursor and any async buffer. It is written
into a hidden temp directory, fsynced, then renamed into place, and only then
is ``<root>/LATEST`` (a one-line file) replaced atomically — so a crash at any
moment leaves either the previous checkpoint or the new one, never half of one.

Re-saving a step that already exists (e.g. the one LATEST names, after a resume) moves the
old directory aside to ``.step_<N>.previous``, renames the new one in, publishes LATEST and
only then deletes the old copy; if a crash leaves LATEST naming a step whose directory is
gone, ``latest_checkpoint`` returns the set-aside copy. ``prune_checkpoints`` orders
checkpoints by their integer step (not by name, which breaks past six digits).

Every checkpoint is tamper-evident: ``meta.json`` records the sha256 of each file beside it
(``files_sha256``) and of its own other contents (``meta_sha256``), and ``load_checkpoint`` verifies
them all before unpickling anything, so a flipped byte is a ``CheckpointError`` naming the file, never
a silently different resume. A checkpoint saved before digests existed is refused (it cannot be told
apart from a corrupted one); a run whose files you trust can be given digests with
``python -m zeromismatch.train.checkpoint --add-digests STEP_DIR`` (``add_digests``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io import atomic_write_bytes, atomic_write_text

LATEST = "LATEST"
_STATE_FILE = "state.pt"
_META_FILE = "meta.json"

_STEP_DIR = re.compile(r"step_(\d+)")
_FILES_KEY = "files_sha256"  # meta.json: {file name: sha256 hex} of every other file in the step
_META_KEY = "meta_sha256"  # meta.json: sha256 of meta.json's other keys (see _meta_digest)
_RESERVED = ("step", _FILES_KEY, _META_KEY)

# Tests set this to simulate a kill between writing the files and publishing them.
_CRASH_ENV = "ZM_CRASH_DURING_CHECKPOINT"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable (the message names the path)."""


def capture_rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global RNG is what user code seeds
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])


@dataclass
class Checkpoint:
    step: int
    path: Path
    state: dict[str, Any]
    meta: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_digest(meta: dict[str, Any]) -> str:
    """sha256 of ``meta`` without its own digest, in a canonical JSON spelling: what meta.json holds
    parses back to the same value, so save and load compute the same digest."""
    body = {key: value for key, value in meta.items() if key != _META_KEY}
    return _sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def _meta_text(step: int, meta: dict[str, Any], files: dict[str, bytes]) -> bytes:
    """meta.json's bytes: ``meta`` with the step and the digests of ``files`` and of itself."""
    body = {"step": step, **meta, _FILES_KEY: {name: _sha256(data) for name, data in files.items()}}
    body = json.loads(json.dumps(body, default=str))  # what a reader will parse: str() for non-JSON
    body[_META_KEY] = _meta_digest(body)
    return json.dumps(body, indent=2, sort_keys=True).encode("utf-8")


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` (tensors and picklable python objects) and ``meta`` (JSON) as step ``step``.

    An OSError while writing (a full disk) names the file; the previous checkpoint and LATEST are
    untouched by it."""
    reserved = sorted(set(meta) & set(_RESERVED))
    if reserved:
        raise ValueError(f"checkpoint meta may not set {reserved}: save_checkpoint writes them")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".step_{step:06d}."))
    try:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        files = {_STATE_FILE: buffer.getvalue()}
        files[_META_FILE] = _meta_text(step, meta, files)
        for name, data in files.items():
            try:
                _write_durably(tmp / name, data)
            except OSError as err:
                reason = f"writing checkpoint step {step}: {err.strerror or err}"
                raise OSError(err.errno, reason, str(final / name)) from err
        if os.environ.get(_CRASH_ENV) == str(step):
            os._exit(17)  # simulated kill: files written, nothing published
        aside = _aside(final)
        if final.exists():
            # an aside left by an interrupted re-save is stale once ``final`` exists again
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST, final.name + "\n")
    shutil.rmtree(aside, ignore_errors=True)
    return final


def _aside(final: Path) -> Path:
    """Where a re-save keeps the previous copy of ``final`` until the new one is published."""
    return final.parent / f".{final.name}.previous"


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The published checkpoint directory, or None when there is none yet."""
    root = Path(root)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{pointer} is unreadable: {err}") from err
    if not _STEP_DIR.fullmatch(name):
        # a name outside step_<N> (empty, a path, garbage) must not send a resume elsewhere
        raise CheckpointError(f"{pointer} names no checkpoint directory step_<N> (holds {name[:80]!r})")
    path = root / name
    if not (path / _STATE_FILE).exists() and (_aside(path) / _STATE_FILE).exists():
        return _aside(path)  # a re-save of this step was interrupted before its rename-in
    if not (path / _STATE_FILE).exists():
        raise CheckpointError(f"{pointer} points at {path}, which has no {_STATE_FILE}")
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint at ``path``, its files verified against the digests meta.json records."""
    path = Path(path)
    try:
        try:
            meta = json.loads((path / _META_FILE).read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(
                f"checkpoint {path} is unreadable: {path / _META_FILE} is not JSON ({err})"
            ) from err
        step = meta.get("step") if isinstance(meta, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            raise CheckpointError(
                f"checkpoint {path} is unreadable: {_META_FILE} has no integer 'step' (got {step!r})"
            )
        files = _verified_files(path, meta)
        state = torch.load(io.BytesIO(files[_STATE_FILE]), map_location="cpu", weights_only=False)
    except FileNotFoundError as err:
        raise CheckpointError(f"checkpoint {path} is incomplete: {err.filename} is missing") from err
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint {path} is unreadable: {err}") from err
    return Checkpoint(step=step, path=path, state=state, meta=meta)


def _verified_files(path: Path, meta: dict[str, Any]) -> dict[str, bytes]:
    """The bytes of every file meta.json lists, each checked against its sha256 (state.pt must be
    listed); CheckpointError naming the first file that differs."""
    digests = meta.get(_FILES_KEY)
    if digests is None and _META_KEY not in meta:
        raise CheckpointError(
            f"checkpoint {path} has no file digests ({_META_FILE} predates them), so it cannot be told "
            "apart from a corrupted one; rerun from the start, or if you trust its files add digests with "
            f"`python -m zeromismatch.train.checkpoint --add-digests {path}`"
        )
    if meta.get(_META_KEY) != _meta_digest(meta):
        raise CheckpointError(
            f"checkpoint {path} is unreadable: {path / _META_FILE} does not match the sha256 it records "
            "(edited or corrupted since it was saved)"
        )
    if not isinstance(digests, dict) or _STATE_FILE not in digests:
        raise CheckpointError(
            f"checkpoint {path} is unreadable: {_META_FILE} records no sha256 of {_STATE_FILE}"
        )
    files = {}
    for name, digest in sorted(digests.items()):
        if "/" in name or name in ("", ".", "..", _META_FILE):
            raise CheckpointError(f"checkpoint {path} is unreadable: {_META_FILE} lists a bad name {name!r}")
        data = (path / name).read_bytes()
        if _sha256(data) != digest:
            raise CheckpointError(
                f"checkpoint {path} is unreadable: {path / name} does not match the sha256 {_META_FILE} "
                "records for it (changed or corrupted since it was saved)"
            )
        files[name] = data
    return files


def add_digests(path: str | os.PathLike) -> None:
    """Give a checkpoint saved before digests existed its digests, trusting its files as they are now.
    The step must load (unpickle) as it is; meta.json is replaced atomically."""
    path = Path(path)
    meta = json.loads((path / _META_FILE).read_text())
    if not isinstance(meta, dict) or _FILES_KEY in meta or _META_KEY in meta:
        raise CheckpointError(f"checkpoint {path}: {_META_FILE} is no digest-less checkpoint meta")
    step = meta.pop("step", None)
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"checkpoint {path} is unreadable: {_META_FILE} has no integer 'step'")
    state = (path / _STATE_FILE).read_bytes()
    torch.load(io.BytesIO(state), map_location="cpu", weights_only=False)  # it must at least unpickle
    atomic_write_bytes(path / _META_FILE, _meta_text(step, meta, {_STATE_FILE: state}))


def prune_checkpoints(root: str | os.PathLike, keep: int, always_keep: Collection[int] = ()) -> None:
    """Delete all but the newest ``keep`` published checkpoints (``keep`` 0: delete none). The one LATEST
    names and the steps in ``always_keep`` (e.g. a run's warm start, step 0) are never deleted and do not
    count towards ``keep``."""
    root = Path(root)
    latest = latest_checkpoint(root)
    for aside in root.glob(".step_*.previous"):  # left by a crash after a re-save's rename-in
        if (root / aside.name[1 : -len(".previous")] / _STATE_FILE).exists():
            shutil.rmtree(aside, ignore_errors=True)
    numbered = [(_STEP_DIR.fullmatch(p.name), p) for p in root.glob("step_*") if p.is_dir()]
    ordered = sorted((int(m.group(1)), p) for m, p in numbered if m)
    steps = [p for step, p in ordered if step not in always_keep]
    for old in steps[:-keep] if keep > 0 else []:
        if latest is None or old.resolve() != latest.resolve():
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zeromismatch.train.checkpoint")
    parser.add_argument("--add-digests", nargs="+", metavar="STEP_DIR", required=True,
                        help="record sha256 digests in checkpoints saved before they existed")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        for path in args.add_digests:
            add_digests(path)
            load_checkpoint(path)
            print(f"{path}: digests recorded")
    except (CheckpointError, OSError, ValueError) as err:
        print(f"checkpoint: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
