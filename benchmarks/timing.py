"""Shared timing helper for ratio benchmarks: interleaved medians, aligned ÷ default.

Case format (other benchmark modules follow it, e.g. ``benchmarks/ops_sequence_cases.py``
exposes ``CASES: list[OpCase]`` and ``benchmarks/ops.py`` runs them next to its own):

    OpCase(
        name="attention",                 # op name, first table column
        shape_desc="T=64 H=8 D=64 bf16",  # human-readable shape, second column
        make_inputs=lambda: (q, k, v, ...),   # builds a fresh tuple of inputs (called once)
        run_aligned=lambda inputs: ...,   # runs the aligned kernel on the tuple
        run_default=lambda inputs: ...,   # runs the default kernel on the same tuple
    )

``measure(case)`` builds the inputs once (outside inference mode, like loaded weights), then,
under ``torch.inference_mode``, calls each runner ``warmup`` times, then alternates aligned and default
calls ``repeats`` times (each sample times ``inner`` back-to-back calls, so microsecond ops
are not dominated by timer overhead), and reports medians. Interleaving means a noisy
neighbour or frequency change hits both sides alike; the ratio is what we publish.
``clock`` is wall time (``time.perf_counter``, the default) or, for single-threaded runs on a
shared machine, this thread's CPU time (``time.thread_time``): time the process spends
descheduled then counts for neither side (cache and memory-bandwidth contention still do).
Thread CPU time is wrong for multi-threaded ops (the other threads' work is not counted),
so callers use it only at one torch thread.
``time_ratio`` = aligned / default (lower is better); ``throughput_ratio`` = default / aligned
(aligned throughput as a fraction of default; the published aligned stacks run at 0.42-0.913x).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class OpCase:
    """One benchmark row: the same inputs run through the aligned and the default kernel."""

    name: str
    shape_desc: str
    make_inputs: Callable[[], tuple]
    run_aligned: Callable[[tuple], Any]
    run_default: Callable[[tuple], Any]
    #: ``run_on(kernels, inputs)`` runs the op on any kernel set (how a native twin calls an op that
    #: takes more than the inputs, e.g. eps); None: the inputs are the op's arguments
    run_on: Callable[[Any, tuple], Any] | None = None


@dataclass
class Timing:
    name: str
    shape_desc: str
    aligned_us: float
    default_us: float

    @property
    def time_ratio(self) -> float:
        return self.aligned_us / self.default_us

    @property
    def throughput_ratio(self) -> float:
        return self.default_us / self.aligned_us


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def _no_sync() -> None:
    return None


def _sample(
    fn: Callable[[tuple], Any], inputs: tuple, inner: int, clock: Callable[[], float], sync=_no_sync
) -> float:
    sync()
    start = clock()
    for _ in range(inner):
        fn(inputs)
    sync()  # a GPU runs asynchronously: the sample ends when its kernels have finished
    return (clock() - start) / inner


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside (tuples, lists, dicts, dataclasses) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        moved = [to_device(item, device) for item in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)  # namedtuple or not
    if isinstance(obj, dict):
        return {key: to_device(value, device) for key, value in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **fields)
    return obj


def _choose_inner(fn: Callable[[tuple], Any], inputs: tuple, target_s: float, clock, sync=_no_sync) -> int:
    one = _sample(fn, inputs, 1, clock, sync)
    return max(1, min(1000, int(target_s / max(one, 1e-7))))


def measure(
    case: OpCase,
    repeats: int = 15,
    warmup: int = 3,
    target_sample_s: float = 0.004,
    clock: str = "wall",
    device: str = "cpu",
) -> Timing:
    """Median time per call of each side, measured interleaved (aligned, default, aligned, ...).

    ``device`` other than the CPU: the inputs are built on the CPU (same numbers) and moved there,
    and each sample synchronizes the device before and after its calls (wall clock only)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    target = torch.device(device)
    if target.type != "cpu" and clock != "wall":
        raise ValueError(f"only the wall clock measures a {target.type} device, got clock={clock!r}")
    tick = CLOCKS[clock]
    sync = _no_sync if target.type == "cpu" else (lambda: torch.cuda.synchronize(target))
    # inputs (weights) are built outside inference mode, as a model's loaded weights are
    inputs = case.make_inputs()
    if target.type != "cpu":
        inputs = to_device(inputs, target)
    with torch.inference_mode():
        for _ in range(warmup):
            case.run_aligned(inputs)
            case.run_default(inputs)
        inner = max(
            _choose_inner(case.run_aligned, inputs, target_sample_s, tick, sync),
            _choose_inner(case.run_default, inputs, target_sample_s, tick, sync),
        )
        aligned, default = [], []
        for r in range(repeats):
            # alternate which side goes first so neither always runs on a warm cache
            if r % 2 == 0:
                aligned.append(_sample(case.run_aligned, inputs, inner, tick, sync))
                default.append(_sample(case.run_default, inputs, inner, tick, sync))
            else:
                default.append(_sample(case.run_default, inputs, inner, tick, sync))
                aligned.append(_sample(case.run_aligned, inputs, inner, tick, sync))
    aligned_us = statistics.median(aligned) * 1e6
    return Timing(case.name, case.shape_desc, aligned_us, statistics.median(default) * 1e6)


def format_table(timings: list[Timing]) -> str:
    """Markdown table: op | shape | aligned us | default us | aligned/default time | throughput ratio."""
    lines = [
        "| op | shape | aligned (us) | default (us) | time aligned/default | throughput aligned/default |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.name} | {t.shape_desc} | {t.aligned_us:.1f} | {t.default_us:.1f} "
            f"| {t.time_ratio:.2f} | {t.throughput_ratio:.2f}x |"
        )
    return "\n".join(lines)


def summarize(timings: list[Timing]) -> str:
    """Geometric-mean and worst throughput ratio per op name."""
    by_op: dict[str, list[float]] = {}
    for t in timings:
        by_op.setdefault(t.name, []).append(t.throughput_ratio)
    lines = ["| op | cases | geomean throughput | worst |", "|---|---:|---:|---:|"]
    for op, ratios in by_op.items():
        geo = statistics.geometric_mean(ratios)
        lines.append(f"| {op} | {len(ratios)} | {geo:.2f}x | {min(ratios):.2f}x |")
    return "\n".join(lines)
