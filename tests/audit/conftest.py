"""Fixtures for the audit tests; helpers live in audit_helpers.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_helpers import PUBLISHED


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results/ directory holding a copy of the real published registry and no runs."""
    root = tmp_path / "results"
    shutil.copytree(PUBLISHED, root / "published")
    return root
