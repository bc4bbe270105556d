"""benchmarks/timing.py: the device plumbing of the ratio benchmarks (no timings are asserted)."""

from __future__ import annotations

import importlib.util
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from zeromismatch.kernels import QuantizedWeight

_path = Path(__file__).parents[1] / "benchmarks" / "timing.py"
_spec = importlib.util.spec_from_file_location("benchmark_timing", _path)
timing = importlib.util.module_from_spec(_spec)
sys.modules["benchmark_timing"] = timing  # dataclasses look their module up by name
_spec.loader.exec_module(timing)


def test_to_device_moves_every_tensor_and_keeps_the_containers():
    Pair = namedtuple("Pair", "a b")
    qweight = QuantizedWeight("fp8", torch.zeros(2, 2), torch.ones(2, 1), (2, 2))
    inputs = (torch.zeros(3), [torch.ones(2), 5], {"w": qweight}, Pair(torch.zeros(1), "x"))
    moved = timing.to_device(inputs, torch.device("meta"))
    assert moved[0].is_meta and moved[1][0].is_meta and moved[1][1] == 5
    assert isinstance(moved[2]["w"], QuantizedWeight) and moved[2]["w"].data.is_meta
    assert moved[2]["w"].global_scale is None and moved[2]["w"].shape == (2, 2)
    assert isinstance(moved[3], Pair) and moved[3].a.is_meta and moved[3].b == "x"
    assert inputs[0].device.type == "cpu"  # the originals are untouched


def test_measure_rejects_the_cpu_clock_for_another_device():
    case = timing.OpCase("noop", "-", lambda: (torch.zeros(1),), lambda i: i[0], lambda i: i[0])
    with pytest.raises(ValueError, match="wall clock"):
        timing.measure(case, repeats=1, clock="cpu", device="meta")
    result = timing.measure(case, repeats=3, warmup=1, target_sample_s=1e-4, device="cpu")
    assert result.aligned_us > 0 and result.default_us > 0
