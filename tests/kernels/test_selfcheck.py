"""``zm invariance`` / ``kernels.selfcheck``: the device-agnostic invariance report.

On this CPU every aligned check must come out identical and the default set must break the
checks it is known to break (so the report cannot pass vacuously). On a GPU (marker ``gpu``) the
same checks run on ``cuda``; what they found on an H200 is recorded in docs/parity.md.
"""

from __future__ import annotations

import json

import pytest
import torch

from zeromismatch.cli import main
from zeromismatch.kernels import get_kernels, selfcheck
from zeromismatch.kernels.selfcheck import (
    CHECKS,
    KernelInvarianceError,
    KernelInvarianceWarning,
    _Tally,
    run_checks,
    verify_invariance,
)

# what the default set breaks on this CPU, per dtype (bf16 GEMMs happen to be row-invariant in oneDNN)
DEFAULT_BREAKS = {
    "fp32": {"linear", "row_parallel_linear", "logprobs", "quant_linear", "attention", "moe", "ssm"},
    "bf16": {"quant_linear", "attention", "ssm"},
}


def test_every_aligned_check_is_identical_on_the_cpu():
    results = run_checks(get_kernels("aligned"), "cpu")
    assert len(results) == 2 * len(CHECKS)
    assert all(r.comparisons > 0 for r in results)
    failing = [(r.op, r.prop, r.dtype, r.max_abs_diff) for r in results if not r.identical]
    assert failing == []


def test_the_default_set_breaks_what_it_is_known_to_break():
    results = run_checks(get_kernels("default"), "cpu")
    for dtype, expected in DEFAULT_BREAKS.items():
        broken = {r.op for r in results if r.dtype == dtype and not r.identical}
        assert expected <= broken, (dtype, expected - broken)
    assert all(r.max_abs_diff > 0 for r in results if not r.identical)  # real differences, not nan


def test_tally_reports_nan_as_an_infinite_difference():
    tally = _Tally()
    tally.compare(torch.tensor([-float("inf"), 1.0]), torch.tensor([-float("inf"), 1.0]))
    assert tally.identical and tally.max_abs_diff == 0.0  # masked logprobs (-inf) compare equal
    tally = _Tally()
    tally.compare(torch.tensor([float("nan")]), torch.tensor([1.0]))
    assert tally.identical is False and tally.max_abs_diff == float("inf")


def test_cli_json_out_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "report.json"
    args = ["invariance", "--only", "linear,rms_norm", "--dtype", "fp32", "--quiet", "--out", str(out)]
    assert main([*args, "--kernels", "aligned,default", "--threads", "1,2"]) == 0
    payload = json.loads(out.read_text())
    runs = payload["runs"]
    assert [(r["kernels"], r["torch_threads"]) for r in runs] == [
        ("aligned", 1),
        ("aligned", 2),
        ("default", 1),
        ("default", 2),
    ]
    assert all(
        r["device"] == "cpu" and {c["op"] for c in r["checks"]} == {"linear", "rms_norm"} for r in runs
    )
    assert (
        all(c["identical"] for r in runs[:2] for c in r["checks"]) and "git_commit" in payload["provenance"]
    )
    assert torch.get_num_threads() == json.loads(out.read_text())["provenance"]["hardware"]["torch_threads"]
    capsys.readouterr()
    args = ["invariance", "--kernels", "default", "--only", "linear", "--dtype", "fp32", "--quiet"]
    assert main(args) == 0
    assert main([*args, "--expect-identical"]) == 1
    assert "NO" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "fp16"], "unknown dtype"),
        (["--only", "convolution"], "unknown check"),
        (["--kernels", "fastest"], "unknown kernel set"),
        (["--device", "nonsense"], "bad --device"),
        (["--threads", "two"], "--threads must be"),
        (["--threads", "-1"], "threads >= 0"),
    ],
)
def test_cli_bad_input_gets_one_clear_error(args, message, capsys, tmp_path):
    out = tmp_path / "kept.json"
    out.write_text("{}")
    assert main(["invariance", "--quiet", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert out.read_text() == "{}"  # nothing already written is lost


def test_cli_bad_out_fails_before_any_check_and_unknown_op_lists_each_op_once(capsys, tmp_path, monkeypatch):
    import zeromismatch.kernels.selfcheck as selfcheck

    monkeypatch.setattr(selfcheck, "run_checks", lambda *a, **k: pytest.fail("ran the checks"))
    afile = tmp_path / "afile"
    afile.write_text("hi")
    for out, message in ((tmp_path, "is a directory"), (afile / "x.json", "is not a directory")):
        assert main(["invariance", "--quiet", "--only", "rms_norm", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    monkeypatch.undo()
    assert main(["invariance", "--quiet", "--only", "convolution"]) == 2
    listed = capsys.readouterr().err.split("choose from ")[1]
    names = [name.strip(" '[]\n") for name in listed.split(",")]
    assert len(names) == len(set(names)) and "linear" in names


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["aligned", "default"])
def test_report_runs_on_cuda(kernels):
    results = run_checks(get_kernels(kernels), "cuda")
    assert len(results) == 2 * len(CHECKS) and all(r.comparisons > 0 for r in results)
    if kernels == "default":
        assert not all(r.identical for r in results)  # the contrast exists on the GPU too


@pytest.mark.gpu
def test_guard_flags_the_aligned_set_on_cuda():
    # measured on an H200 (results/reproduced/portability/): cuBLAS picks its GEMM kernel by shape, so
    # the CPU-aligned GEMMs and attention are not row/phase invariant there, and the guard must say so
    with pytest.warns(KernelInvarianceWarning, match="linear/rows"):
        verify_invariance(get_kernels("aligned"), "cuda", torch.float32)


# ---- the guard the engine and the trainer run ---------------------------------------------------
def _claiming_default_set():
    """The real default kernels under a set that claims the aligned promises (it breaks them here)."""
    default_cls = type(get_kernels("default"))
    return type(
        "ClaimingDefault", (default_cls,), {"name": "claiming-default", "promises_invariance": True}
    )()


def test_guard_is_silent_for_the_aligned_set_and_for_sets_that_promise_nothing(recwarn):
    assert verify_invariance(get_kernels("aligned"), "cpu", torch.float32) == []
    assert verify_invariance(get_kernels("default"), "cpu", torch.float32) == []  # promises nothing
    assert verify_invariance(get_kernels("aligned"), "cpu", torch.float64) == []  # no fp64 checks
    assert not [w for w in recwarn if issubclass(w.category, KernelInvarianceWarning)]


def test_guard_warns_raises_or_stays_off_for_a_broken_promise(monkeypatch):
    claiming = _claiming_default_set()
    with pytest.warns(KernelInvarianceWarning, match=r"linear/rows .*zm invariance.*GEMM_TILE_ROWS=8"):
        failing = verify_invariance(claiming, "cpu", torch.float32)
    assert {r.op for r in failing} >= DEFAULT_BREAKS["fp32"]
    monkeypatch.setenv("ZEROMISMATCH_SELFCHECK", "error")
    with pytest.raises(KernelInvarianceError, match="claiming-default"):
        verify_invariance(claiming, "cpu", torch.float32)
    monkeypatch.setenv("ZEROMISMATCH_SELFCHECK", "off")
    assert verify_invariance(claiming, "cpu", torch.float32) == []
    monkeypatch.setenv("ZEROMISMATCH_SELFCHECK", "loud")
    with pytest.raises(ValueError, match="ZEROMISMATCH_SELFCHECK"):
        verify_invariance(claiming, "cpu", torch.float32)


def test_guard_measures_once_per_device_dtype_and_thread_count():
    claiming = _claiming_default_set()
    before = len(selfcheck._verified)
    with pytest.warns(KernelInvarianceWarning):
        verify_invariance(claiming, "cpu", torch.bfloat16)
        verify_invariance(claiming, "cpu", torch.bfloat16)
    assert len(selfcheck._verified) == before + 1


def test_engine_and_trainer_run_the_guard(monkeypatch):
    from zeromismatch.engine import LLM
    from zeromismatch.train.logprobs import compute_logprobs

    monkeypatch.setenv("ZEROMISMATCH_SELFCHECK", "error")
    claiming = _claiming_default_set()
    with pytest.raises(KernelInvarianceError):
        LLM("tiny-qwen3", claiming, max_num_seqs=2)
    llm = LLM("tiny-qwen3", "aligned", max_num_seqs=2)  # holds here: no error
    with pytest.raises(KernelInvarianceError):
        compute_logprobs(llm.model, [[1, 2]], [[3]], kernels=claiming)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_rows", [8, 16])
def test_portable_mode_keeps_every_check_but_the_fp32_column_split_on_cuda(tile_rows):
    # measured on an H200 (results/reproduced/portability/invariance_h200-node-tiles*.json): fixed-shape
    # GEMM and attention calls make cuBLAS row- and batch-invariant; a column shard is still a call
    # with fewer output columns, which fp32 cuBLAS computes differently
    from zeromismatch.kernels.aligned import gemm

    gemm.set_gemm_tile_rows(tile_rows)
    try:
        results = run_checks(get_kernels("aligned"), "cuda")
    finally:
        gemm.set_gemm_tile_rows(0)
    failing = {(r.op, r.prop, r.dtype) for r in results if not r.identical}
    assert failing <= {("linear", "column_split", "fp32")}
