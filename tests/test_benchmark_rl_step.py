"""benchmarks/rl_step.py: a tiny run writes both arms' step times and the ratios; a bad --out is one
line naming the flag, exit 2, before anything is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeromismatch.kernels.native import available, unavailable_reason

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "rl_step.py"


@pytest.mark.skipif(not available(), reason=f"native kernels: {unavailable_reason()}")
def test_tiny_run_writes_both_arms(tmp_path):
    out = tmp_path / "rl_step.json"
    args = ["--steps", "2", "--repeats", "2", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["kernels"] == {"aligned": "aligned-native", "fast": "fast-native"}
    # two runs per arm, each with its first step (graph captures) left out
    assert all(arm["steps_timed"] == 2 for arm in result["arms"].values())
    assert result["ratio_aligned_over_fast_per_step"] > 0 and result["ratio_aligned_over_fast_per_token"] > 0


def test_bad_out_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "afile" / "o.json")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "--out" in done.stderr.strip().splitlines()[-1] and "Traceback" not in done.stderr
