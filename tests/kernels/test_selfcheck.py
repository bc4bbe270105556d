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
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.selfcheck import CHECKS, _Tally, run_checks

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
    assert (
        main(["invariance", "--only", "linear,rms_norm", "--dtype", "fp32", "--quiet", "--out", str(out)])
        == 0
    )
    payload = json.loads(out.read_text())
    assert payload["device"] == "cpu" and {c["op"] for c in payload["checks"]} == {"linear", "rms_norm"}
    assert all(c["identical"] for c in payload["checks"]) and "git_commit" in payload["provenance"]
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
    ],
)
def test_cli_bad_input_gets_one_clear_error(args, message, capsys, tmp_path):
    out = tmp_path / "kept.json"
    out.write_text("{}")
    assert main(["invariance", "--quiet", "--out", str(out), *args]) == 2
    assert message in capsys.readouterr().err
    assert out.read_text() == "{}"  # nothing already written is lost


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["aligned", "default"])
def test_report_runs_on_cuda(kernels):
    results = run_checks(get_kernels(kernels), "cuda")
    assert len(results) == 2 * len(CHECKS) and all(r.comparisons > 0 for r in results)
    if kernels == "default":
        assert not all(r.identical for r in results)  # the contrast exists on the GPU too


@pytest.mark.gpu
def test_aligned_promises_hold_on_cuda():
    results = run_checks(get_kernels("aligned"), "cuda")
    assert [(r.op, r.prop, r.dtype, r.max_abs_diff) for r in results if not r.identical] == []
