"""The report's portability section renders what ``zm invariance`` and the GEMM probe wrote."""

from __future__ import annotations

import json

import pytest

from zeromismatch.audit.portability import portability_lines
from zeromismatch.audit.registry import AuditInputError
from zeromismatch.cli import main


def _folder(tmp_path):
    folder = tmp_path / "reproduced" / "portability"
    folder.mkdir(parents=True)
    return folder


def test_no_files_no_section(tmp_path):
    assert portability_lines(tmp_path) == []


def test_invariance_rows_come_from_a_real_zm_invariance_run(tmp_path):
    out = _folder(tmp_path) / "invariance_here.json"
    args = ["invariance", "--kernels", "aligned,default", "--only", "linear", "--dtype", "fp32", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    rows = [line for line in portability_lines(tmp_path) if line.startswith("| `invariance_here.json`")]
    assert len(rows) == 2
    assert "| aligned |" in rows[0] and rows[0].endswith("| off | 2/2 | - |")  # holds on this CPU
    assert "| default |" in rows[1] and rows[1].endswith("| off | 1/2 | linear/rows fp32 |")


def test_gemm_tables_count_broken_shapes_and_thread_counts(tmp_path):
    folder = _folder(tmp_path)
    findings = {
        "fp32 K=8 N=8 F.linear T=16 threads=1": {"bad_M": [], "bad_offsets": []},
        "fp32 K=8 N=8 F.linear T=16 threads=16": {"bad_M": [3], "bad_offsets": []},
        "fp32 K=8 N=8 F.linear T=16 threads_differing_from_1": [16],
        "fp32 K=4 N=8 F.linear T=16 threads=1": {"bad_M": [], "bad_offsets": []},
        "fp32 K=4 N=8 F.linear T=16 threads=16": {"bad_M": [], "bad_offsets": []},
        "fp32 K=4 N=8 F.linear T=16 threads_differing_from_1": [],
        "bf16 K=4 N=8 F.linear T=16 threads=1": {"bad_M": [], "bad_offsets": []},
        "bf16 K=4 N=8 F.linear T=16 threads_differing_from_1": [],
    }
    tiles = {"mode": "tiles", "device_name": "cpu", "torch": "2.x", "findings": findings}
    (folder / "gemm_tiles_x.json").write_text(json.dumps(tiles))
    rows = {"bf16 K=8 N=8 aligned_linear": {"bad_M": [], "bad_offsets": [1]}}
    (folder / "gemm_rows_x.json").write_text(
        json.dumps({"mode": "rows", "device_name": "GPU", "findings": rows})
    )
    text = "\n".join(portability_lines(tmp_path))
    assert "| F.linear | 16 | 1/2 (at 16 threads); bits change at 16 threads | 0/1 |" in text
    assert "| GPU, torch ? | `gemm_rows_x.json` (unknown) | aligned_linear | - | 1/1 |" in text


def test_malformed_files_get_one_clear_error(tmp_path):
    folder = _folder(tmp_path)
    (folder / "invariance_bad.json").write_text('{"runs": []}')
    with pytest.raises(AuditInputError, match="invariance_bad.json has no runs"):
        portability_lines(tmp_path)
    (folder / "invariance_bad.json").unlink()
    (folder / "gemm_rows_bad.json").write_text(json.dumps({"findings": {"what is this": {}}}))
    with pytest.raises(AuditInputError, match="unexpected entry"):
        portability_lines(tmp_path)


def test_device_and_portable_mode_ops_tables(tmp_path):
    folder = _folder(tmp_path)
    cases = [
        {"op": "linear", "shape": "M=1", "throughput_ratio": 0.25},
        {"op": "linear", "throughput_ratio": 1.0},
    ]
    gpu = {"provenance": {"hardware": {"gpu": "NVIDIA H200"}, "git_commit": "abc"}}
    (folder / "ops_cuda.json").write_text(json.dumps({"device": "cuda", "cases": cases, **gpu}))
    cpu = {"hardware": {"cpu_model": "Some CPU"}, "numerics": {"gemm_tile_rows": 16}}
    (folder / "ops_cpu-tiles.json").write_text(
        json.dumps({"device": "cpu", "threads": 1, "cases": cases, "provenance": cpu})
    )
    text = "\n".join(portability_lines(tmp_path))
    assert "Per-op throughput on NVIDIA H200, aligned ÷ default" in text and "not aligned there" in text
    assert "Per-op throughput on Some CPU, portable mode (16-row GEMM tiles)" in text
    assert text.count("| linear | 2 | 0.50 | 0.25 | 1 |") == 2  # one of the two shapes is below 0.9
    assert "| op | shapes | geomean | worst | shapes below 0.9 |" in text


def test_commits_keep_dirty_and_stated_suffixes(tmp_path):
    folder = _folder(tmp_path)
    full = "0123456789abcdef0123456789abcdef01234567"
    stated = f"{full} (stated by ZEROMISMATCH_GIT_COMMIT; local git: {full[::-1]}-dirty)"
    cases = [{"op": "linear", "throughput_ratio": 1.0}]
    (folder / "ops_cpu.json").write_text(
        json.dumps({"device": "cpu", "cases": cases, "provenance": {"git_commit": stated}})
    )
    findings = {"fp32 K=8 N=8 F.linear": {"bad_M": [], "bad_offsets": []}}
    (folder / "gemm_rows_x.json").write_text(
        json.dumps({"findings": findings, "provenance": {"git_commit": full + "-dirty"}})
    )
    text = "\n".join(portability_lines(tmp_path))
    assert "git 0123456789ab (stated by ZEROMISMATCH_GIT_COMMIT; local git: 76543210fedc-dirty))" in text
    assert "| `gemm_rows_x.json` (0123456789ab-dirty) |" in text
