"""benchmarks/alignment_cost.py: a one-cell grid writes both sets' medians, the ratio and the summary;
``--resume`` keeps the cells already measured at this commit; a bad --out is one line naming the
flag, exit 2, before anything is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeromismatch.kernels.native import available, unavailable_reason

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "alignment_cost.py"
ONE_CELL = ["--cells", "tiny", "--presets", "tiny-qwen3", "--threads", "1", "--batches", "2",
            "--formats", "bf16-fp8", "--workloads", "decode", "--repeats", "2", "--quiet"]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not available(), reason=f"native kernels: {unavailable_reason()}")
def test_one_cell_writes_the_ratio_and_resume_keeps_it(tmp_path):
    out = tmp_path / "alignment_cost.json"
    done = run(*ONE_CELL, "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["complete"] is True
    (cell,) = result["cells"]
    assert (cell["preset"], cell["format"], cell["batch"], cell["new_tokens"]) == (
        "tiny-qwen3",
        "bf16-fp8",
        2,
        256,
    )
    assert set(cell["median_tokens_per_s"]) == {"engine-aligned-native", "engine-fast-native"}
    # --repeats 2 at least; more when the runs are short (each set timed >= MIN_SECONDS in all)
    assert cell["repeats"] >= 2 and all(len(s) == cell["repeats"] for s in cell["runs_seconds"].values())
    ratio = cell["ratio_aligned_native_over_fast_native"]
    assert ratio > 0 and result["summary"]["worst_cell"]["ratio_aligned_native_over_fast_native"] == ratio
    # both sides replayed decode step graphs: the comparison is like for like
    assert all(stats["replays"] > 0 for stats in cell["step_graphs"].values())

    again = run(*ONE_CELL, "--resume", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["cells"] == result["cells"]


def test_bad_out_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    done = run("--out", str(tmp_path / "afile" / "out.json"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "--out" in lines[-1] and "Traceback" not in done.stderr
