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
