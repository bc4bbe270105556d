"""A run directory's ``manifest.json``: the sha256 of every data file it holds.

A run writes its manifest last (after summary.json), and a postprocess that rewrites a summary
(:func:`zeromismatch.experiment.spec.add_to_summary`) writes it again, so a finished run's manifest
matches its files; ``zm audit`` then reports any file edited, added or removed since
(:func:`check_manifest`). It makes tampering *evident*, not impossible: whoever rewrites a file can
rewrite the manifest too, which is why the audit also compares committed results with git HEAD.

Covered: every regular file under the run directory, by its path relative to it, except
``manifest.json`` itself, anything under a hidden name (``.lock``, ``.<name>.tmp`` files of an
atomic write, ``.<arm>.partial/`` runs in progress), ``checkpoints/`` and ``wandb/`` (large,
rewritten, and read by no audit), and sub-directories that are run directories themselves
(``<run>/<arm>/`` arms carry their own manifest).

Imports nothing of the audit or the RL stack, so the code that writes runs can call it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .io import atomic_write_json

MANIFEST = "manifest.json"
# the names that make a directory a run directory (what runs write and the audit reads)
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "provenance.json")
SKIPPED_DIRS = ("checkpoints", "wandb")
_CHUNK = 1 << 20


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in RUN_FILES)


def _skipped(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRS


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def covered_files(run_dir: str | os.PathLike) -> list[str]:
    """The files a manifest of ``run_dir`` covers, as sorted POSIX paths relative to it."""
    root = Path(run_dir)
    found = []
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        # pruned in place so os.walk never descends into them
        dirs[:] = [d for d in dirs if not _skipped(d) and not is_run_dir(here / d)]
        for name in files:
            path = here / name
            if _skipped(name) or (here == root and name == MANIFEST) or not path.is_file():
                continue
            found.append(path.relative_to(root).as_posix())
    return sorted(found)


def compute_manifest(run_dir: str | os.PathLike) -> dict:
    root = Path(run_dir)
    return {"sha256": {name: sha256_file(root / name) for name in covered_files(root)}}


def write_manifest(run_dir: str | os.PathLike) -> Path:
    """Write ``<run_dir>/manifest.json`` for the files there now (atomically); returns its path.

    Deterministic (no timestamps): sealing unchanged files again rewrites identical bytes."""
    path = Path(run_dir) / MANIFEST
    atomic_write_json(path, compute_manifest(run_dir))
    return path


def manifest_problems(run_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for each file that differs from ``run_dir``'s manifest, ``file``
    relative to ``run_dir``; empty when everything matches."""
    root = Path(run_dir)
    path = root / MANIFEST
    if not path.is_file():
        return [(MANIFEST, "missing, so the run's files cannot be checked")]
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [(MANIFEST, f"unreadable ({err})")]
    listed = document.get("sha256") if isinstance(document, dict) else None
    if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
        return [(MANIFEST, 'malformed (expected {"sha256": {file: hex digest}})')]
    present = set(covered_files(root))
    problems = []
    for name in sorted(present | set(listed)):
        if name not in listed:
            problems.append((name, f"not listed in {MANIFEST} (added after the run was sealed)"))
        elif name not in present:
            problems.append((name, f"listed in {MANIFEST} but missing"))
        elif sha256_file(root / name) != listed[name]:
            problems.append((name, f"contents differ from their sha256 in {MANIFEST}"))
    return problems


def check_manifest(run_dir: str | os.PathLike) -> list[str]:
    """:func:`manifest_problems` as ``"<file>: <what>"`` lines; empty when everything matches."""
    return [f"{name}: {what}" for name, what in manifest_problems(run_dir)]
