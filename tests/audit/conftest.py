"""Fixtures for the audit tests; helpers live in audit_helpers.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_helpers import PUBLISHED

#: claims frozen as they were while their experiment ran one unseeded run per arm (DeepSeek's, and
#: REINFORCE Zero's with its arithmetic ``default`` / ``tools_aligned`` arms): the synthetic runs of the
#: audit-mechanics tests (one run per arm, e.g. audit_helpers.deepseek_records) are judged by these; the
#: real registry (seeded arms, ``over_seeds``) is validated in test_registry.py and judged on the
#: committed runs by test_seeded_arms.py and the report
FROZEN_CLAIMS = sorted((Path(__file__).parent / "fixtures").glob("*.json"))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results/ directory holding a copy of the published registry (with ``FROZEN_CLAIMS`` in place
    of today's claims of their experiments) and no runs."""
    root = tmp_path / "results"
    shutil.copytree(PUBLISHED, root / "published")
    for frozen in FROZEN_CLAIMS:
        shutil.copy(frozen, root / "published" / frozen.name)
    return root
