"""docs/parity.md's "How large is the baseline's mismatch" table is the one scripts/baseline_mismatch.py
renders from results/reproduced/baseline_mismatch/*.json: no number in it is typed by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "baseline_mismatch", ROOT / "scripts" / "baseline_mismatch.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_is_the_rendered_data():
    script = _script()
    files = sorted((ROOT / "results" / "reproduced" / "baseline_mismatch").glob("*.json"))
    assert files, "no baseline_mismatch data"
    rendered = script.table([json.loads(path.read_text()) for path in files])
    assert rendered in (ROOT / "docs" / "parity.md").read_text()


def test_every_aligned_stack_measured_exactly_zero_on_trained_weights():
    for path in sorted((ROOT / "results" / "reproduced" / "baseline_mismatch").glob("*.json")):
        result = json.loads(path.read_text())
        for stack, row in result["stacks"].items():
            if stack.startswith("aligned-"):
                assert [row[k] for k in ("diff_max", "diff_mean", "diff_std", "k3_kl")] == [0.0] * 4, (
                    path,
                    stack,
                )
            else:
                assert row["diff_max"] > 0, (path, stack)  # the inverse: every fast stack differs
