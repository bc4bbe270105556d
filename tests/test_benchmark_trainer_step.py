"""benchmarks/trainer_step.py: a tiny run writes both sets' medians and the ratio; a bad --out is
one line naming the flag, exit 2, before anything is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeromismatch.kernels.native import available, unavailable_reason

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "trainer_step.py"


@pytest.mark.skipif(not available(), reason=f"native kernels: {unavailable_reason()}")
def test_tiny_run_writes_the_ratio(tmp_path):
    out = tmp_path / "trainer_step.json"
    args = ["--seqs", "2", "--seq-len", "8", "--repeats", "2", "--quiet", "--out", str(out)]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result["median_tokens_per_s"]) == {"aligned-native", "fast-native"}
    assert result["ratio_aligned_native_over_fast_native"] > 0
    assert all(len(v) == 2 for v in result["runs_seconds"].values())


def test_bad_out_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "out.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "--out" in lines[-1] and "Traceback" not in done.stderr
