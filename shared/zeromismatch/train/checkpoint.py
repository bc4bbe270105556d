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
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io import atomic_write_text

LATEST = "LATEST"
_STATE_FILE = "state.pt"
_META_FILE = "meta.json"

_STEP_DIR = re.compile(r"step_(\d+)")

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


def save_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` (tensors and picklable python objects) and ``meta`` (JSON) as step ``step``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".step_{step:06d}."))
    try:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with open(tmp / _STATE_FILE, "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / _META_FILE, "w") as f:
            json.dump({"step": step, **meta}, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
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
    path = root / pointer.read_text().strip()
    if not (path / _STATE_FILE).exists() and (_aside(path) / _STATE_FILE).exists():
        return _aside(path)  # a re-save of this step was interrupted before its rename-in
    if not (path / _STATE_FILE).exists():
        raise CheckpointError(f"{pointer} points at {path}, which has no {_STATE_FILE}")
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    path = Path(path)
    try:
        meta = json.loads((path / _META_FILE).read_text())
        state = torch.load(path / _STATE_FILE, map_location="cpu", weights_only=False)
    except FileNotFoundError as err:
        raise CheckpointError(f"checkpoint {path} is incomplete: {err.filename} is missing") from err
    except (json.JSONDecodeError, pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable: {err}") from err
    step = meta.get("step") if isinstance(meta, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(
            f"checkpoint {path} is unreadable: {_META_FILE} has no integer 'step' (got {step!r})"
        )
    return Checkpoint(step=step, path=path, state=state, meta=meta)


def prune_checkpoints(root: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` published checkpoints (never the one LATEST names)."""
    root = Path(root)
    latest = latest_checkpoint(root)
    for aside in root.glob(".step_*.previous"):  # left by a crash after a re-save's rename-in
        if (root / aside.name[1 : -len(".previous")] / _STATE_FILE).exists():
            shutil.rmtree(aside, ignore_errors=True)
    numbered = [(_STEP_DIR.fullmatch(p.name), p) for p in root.glob("step_*") if p.is_dir()]
    steps = [p for _, p in sorted((int(m.group(1)), p) for m, p in numbered if m)]
    for old in steps[:-keep] if keep > 0 else []:
        if latest is None or old.resolve() != latest.resolve():
            shutil.rmtree(old, ignore_errors=True)
