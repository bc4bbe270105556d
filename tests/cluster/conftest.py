"""The Slurm controller fixture of the slurm-marked tests (tests/cluster/slurm_helpers.py)."""

from __future__ import annotations

import pytest
from slurm_helpers import accounting_enabled, slurm_unavailable_reason


@pytest.fixture(scope="module")
def slurm_controller():
    """Skips, with the reason, when no Slurm controller answers; else whether sacct records jobs."""
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return {"accounting": accounting_enabled()}
