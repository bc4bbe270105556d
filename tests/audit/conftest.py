"""Fixtures for the audit tests; helpers live in audit_helpers.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_helpers import PUBLISHED

#: the DeepSeek claims as they were while that experiment ran one unseeded run per arm: the synthetic
#: runs of the audit-mechanics tests (audit_helpers.deepseek_records: one run, ``aligned.*`` keys) are
#: judged by these; the real registry (seeded arms, ``over_seeds``) is validated in test_registry.py and
#: judged on the committed runs by test_seeded_arms.py and the report
FROZEN_CLAIMS = Path(__file__).parent / "fixtures" / "deepseek_v4_flash_100steps.json"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results/ directory holding a copy of the published registry (DeepSeek's claims frozen as
    ``FROZEN_CLAIMS``) and no runs."""
    root = tmp_path / "results"
    shutil.copytree(PUBLISHED, root / "published")
    shutil.copy(FROZEN_CLAIMS, root / "published" / FROZEN_CLAIMS.name)
    return root
