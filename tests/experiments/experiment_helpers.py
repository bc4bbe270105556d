"""Shared by the experiment tests: the experiment folders and loading one's ``EXPERIMENT``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/configs.py"))


def load(name: str):
    path = ROOT / "experiments" / name / "configs.py"
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EXPERIMENT


def git(where: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=where, check=True,
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def make_checkout(
    where: Path,
    paths: tuple[str, ...] = (
        "experiments/osworld_step_time",
        "results/published",
        "cluster/profiles",
        "paper_figures",
    ),
) -> Path:
    """A second checkout of this project at ``where``: a git repository holding copies of ``paths`` from
    this working tree, committed (a copy rather than a clone of HEAD, so uncommitted work is what it runs)."""
    import shutil

    for rel in paths:
        source = ROOT / rel
        if source.is_dir():
            shutil.copytree(source, where / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / rel)
    (where / ".gitignore").write_text("/runs/\n__pycache__/\n")
    git(where, "init", "-q")
    git(where, "add", ".")
    git(where, "commit", "-qm", "second checkout")
    return where
