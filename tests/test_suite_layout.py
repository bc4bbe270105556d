"""The test tree has no __init__.py files (rootdir-relative imports), so two test modules with one
basename make pytest stop at collection ("import file mismatch") on a clean checkout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_module_basenames_are_unique():
    tests = Path(__file__).parent
    names = Counter(p.name for p in tests.rglob("test_*.py"))
    assert not [name for name, count in names.items() if count > 1]
