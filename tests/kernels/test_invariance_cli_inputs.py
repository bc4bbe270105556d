"""``zm invariance``: every bad --dtype, --device and --seed is one clear error naming the flag, and
--expect-identical never passes on zero checks."""

from __future__ import annotations

import pytest
import torch

import zeromismatch.kernels.selfcheck as selfcheck
from zeromismatch.cli import main
from zeromismatch.kernels import get_kernels

SEED_LIMIT = 2**63 // 1000  # run_checks seeds check i with seed * 1000 + i; torch takes int64 seeds


def _invariance(*args: str) -> list[str]:
    return ["invariance", "--quiet", "--kernels", "default", "--only", "rms_norm", *args]


@pytest.mark.parametrize("dtype", [",", "", " , "])
def test_no_dtype_is_an_error_not_zero_checks(dtype, capsys):
    assert main(_invariance("--dtype", dtype, "--expect-identical")) == 2
    err = capsys.readouterr().err
    assert err.startswith("zm invariance: --dtype") and err.count("\n") == 1


def test_run_checks_refuses_an_empty_dtype_list():
    with pytest.raises(ValueError, match="no dtype"):
        selfcheck.run_checks(get_kernels("aligned"), "cpu", ())


def test_expect_identical_fails_when_no_check_ran(monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "run_checks", lambda *args, **kwargs: [])
    assert main(_invariance("--dtype", "fp32", "--expect-identical")) == 1
    assert "no check ran" in capsys.readouterr().err
    assert main(_invariance("--dtype", "fp32")) == 0  # without the flag nothing is expected


def _fake_cuda(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("device", "cuda_devices", "message"),
    [
        ("mps", 0, "choose cpu or cuda"),
        ("meta", 0, "choose cpu or cuda"),
        ("xla", 0, "choose cpu or cuda"),
        ("nonsense", 0, "bad --device"),
        ("cuda", 0, "no CUDA device"),
        ("cuda:3", 1, "torch sees 1 CUDA device"),
        # torch claims a device that cannot hold a tensor (on this CPU-only torch: not compiled with CUDA)
        pytest.param("cuda:0", 1, "bad --device 'cuda:0'", marks=pytest.mark.skipif(
            torch.cuda.is_available(), reason="needs a torch that cannot allocate on CUDA")),
    ],
)  # fmt: skip
def test_bad_device_is_one_clear_error(device, cuda_devices, message, monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "run_checks", lambda *a, **k: pytest.fail("ran the checks"))
    if not torch.cuda.is_available():
        _fake_cuda(monkeypatch, cuda_devices)
    assert main(_invariance("--device", device)) == 2
    err = capsys.readouterr().err
    assert message in err and "--device" in err and err.count("\n") == 1


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT, 2**64 // 1000])
def test_seed_out_of_range_is_one_clear_error(seed, capsys):
    assert main(_invariance("--seed", str(seed))) == 2
    err = capsys.readouterr().err
    assert err.startswith("zm invariance: --seed") and err.count("\n") == 1
    with pytest.raises(ValueError, match="seed must be"):
        selfcheck.run_checks(get_kernels("aligned"), "cpu", ("fp32",), seed)


def test_largest_seed_runs(capsys):
    assert selfcheck.SEED_LIMIT == SEED_LIMIT
    assert main(_invariance("--dtype", "fp32", "--seed", str(SEED_LIMIT - 1))) == 0
