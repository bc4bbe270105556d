"""Where an engine step's time goes, against the per-step budget of issue 5's 3x-HF target.

``benchmarks/rollout.py`` measures the ratio; this script explains it. One run, on the rollout
benchmark's workload (the same prompts, weights and sampling; aligned-native kernels), times:
- ``hf-generate`` and ``engine`` (uninstrumented), in rotating order, ``--repeats`` times each: the
  ratio and the budget, ``budget_ms_per_step`` = the engine's wall time per step at 3x HF's
  median tokens/s;
- ``engine-instrumented`` (as many times): the same generate with a timer around each phase of
  ``LLM._step`` -- ``schedule`` (scheduler), ``build_batch`` (the packed ForwardBatch), ``forward``
  (the model), ``logits`` (the sampled rows' lm_head), ``sampler`` -- the rest being ``bookkeeping``
  (per-request token lists, stop checks, output objects), and a timer around every call into the
  native C library, charged to the phase it ran in. A phase's time minus its C time is Python and
  torch-op time (views, copies, residual adds, the sampler's torch ops, argument checks).

The timers cost about 0.3 us a call; ``instrumentation_overhead`` (instrumented ÷ plain median)
says by how much they inflate the phases. Medians over repeats; each phase per engine step.

The question it answers: if every Python and torch-op cost outside the C kernels were removed,
would the engine meet 3x HF? ``native_ms_per_step`` against ``budget_ms_per_step`` says.

Usage: ``python benchmarks/rollout_breakdown.py [--model tiny-qwen3] [--dtype fp32] [--repeats 5]
[--threads 1] [--quiet] [--out results/reproduced/benchmarks/rollout_breakdown.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import (  # noqa: E402
    DTYPES,
    WARM_UP_TOKENS,
    add_workload_arguments,
    build_hf_model,
    check_outputs,
    make_engine,
    make_prompts,
    run_rotating,
    time_hf,
    usage_since,
)

from zeromismatch._provenance import provenance  # noqa: E402
from zeromismatch.argtypes import check_out_or_exit, int_at_least  # noqa: E402
from zeromismatch.engine import LLM, SamplingParams  # noqa: E402
from zeromismatch.engine.llm import build_preset  # noqa: E402
from zeromismatch.io import atomic_write_json  # noqa: E402
from zeromismatch.kernels.native import _build  # noqa: E402
from zeromismatch.kernels.native import unavailable_reason as native_unavailable_reason  # noqa: E402

PHASES = ("schedule", "build_batch", "forward", "logits", "sampler")
TARGET_OVER_HF = 3.0


class _Timers:
    """Wall seconds per phase and, within each phase, in native C calls (and their count)."""

    def __init__(self) -> None:
        self.phase = Counter()
        self.native = Counter()
        self.native_calls = Counter()
        self.current = "bookkeeping"


class _TimedCalls:
    """Stands in for a callable object: calls go through ``timed``, attributes to the object."""

    def __init__(self, inner, timed) -> None:
        self._inner, self._timed = inner, timed

    def __call__(self, *args, **kwargs):
        return self._timed(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextlib.contextmanager
def _instrumented(llm: LLM, timers: _Timers):
    """Timers around ``llm``'s step phases and every native library entry point, removed on exit."""
    patched: list[tuple[object, str, bool, object]] = []

    def wrap_phase(owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)
        # (owner, name, whether the instance held the attribute itself, what it held)
        patched.append((owner, name, name in vars(owner), vars(owner).get(name)))

        def timed(*args, **kwargs):
            outer, timers.current = timers.current, phase
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                # exclusive times: a phase timed inside another (batch_values inside a graph's
                # forward, the model's forward inside a capture) is taken out of the outer one
                timers.phase[phase] += elapsed
                if outer != "bookkeeping":
                    timers.phase[outer] -= elapsed
                timers.current = outer

        # a callable object (the sampler) stays an object with its own attributes (a step-graph
        # capture calls its ``race``); only its calls are timed
        setattr(
            owner, name, timed if callable(getattr(inner, "__func__", None)) else _TimedCalls(inner, timed)
        )

    library = _build.library()
    names = [n for n in _build.ENTRY_POINTS if hasattr(library, n)]
    names += ["silu_mul_tensors"] if library.silu_mul_tensors is not None else []
    originals = {n: getattr(library, n) for n in names}

    def wrap_native(name: str):
        inner = originals[name]

        def timed(*args):
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                timers.native[timers.current] += time.perf_counter() - start
                timers.native_calls[timers.current] += 1

        return timed

    try:
        wrap_phase(llm.scheduler, "schedule", "schedule")
        wrap_phase(llm.runner, "batch_values", "build_batch")
        wrap_phase(llm.runner, "build_batch", "build_batch")
        wrap_phase(llm.runner.graphs, "forward", "forward")  # a replayed step (or a capture)
        wrap_phase(llm.runner.model, "forward", "forward")  # an eager one
        wrap_phase(llm.runner, "compute_logits", "logits")
        wrap_phase(llm.runner, "sampler", "sampler")  # an instance attribute: the Sampler object
        for name in names:
            setattr(library, name, wrap_native(name))
        yield
    finally:
        for name, fn in originals.items():
            setattr(library, name, fn)
        for owner, name, held, value in reversed(patched):
            if held:
                setattr(owner, name, value)
            else:
                delattr(owner, name)  # the instance attribute shadowing the class's method


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--threads", type=int_at_least(1), default=1)
    parser.add_argument("--quiet", action="store_true", help="no per-repetition lines")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)
    from zeromismatch.models.presets import PRESETS

    if args.model not in PRESETS:
        parser.error(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")
    reason = native_unavailable_reason()
    if reason is not None:
        print(f"rollout_breakdown.py: needs the aligned-native kernels: {reason}", file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model = build_preset(args.model, "aligned", dtype, args.seed)
    prompts = make_prompts(args.batch, args.prompt_len, int(model.config.vocab_size), args.seed)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.new_tokens, seed=1)
    hf = build_hf_model(model, dtype)
    warm_up = make_engine(model, "aligned-native", prompts[:2])
    warm_up.generate(prompts[:2], SamplingParams(max_tokens=WARM_UP_TOKENS, seed=1))

    def run_engine(instrument: bool, enforce_eager: bool = False) -> tuple[float, int, dict]:
        """rollout.py's timer protocol: (seconds, tokens, extra fields of the run's record)."""
        llm = make_engine(model, "aligned-native", prompts, enforce_eager=enforce_eager)
        timers = _Timers()
        before = resource.getrusage(resource.RUSAGE_SELF)
        with _instrumented(llm, timers) if instrument else contextlib.nullcontext():
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
        check_outputs(outputs, args.new_tokens)
        extra = {**usage_since(before), "steps": llm.num_steps, "step_graphs": llm.runner.graphs.stats()}
        if instrument:
            extra["phase_seconds"] = dict(timers.phase)
            extra["native_seconds"] = dict(timers.native)
            extra["native_calls"] = dict(timers.native_calls)
        return seconds, sum(len(o.token_ids) for o in outputs), extra

    timers = {
        "hf-generate": lambda: time_hf(hf, prompts, args.new_tokens, args.temperature),
        "engine": lambda: run_engine(False),
        "engine-eager": lambda: run_engine(False, enforce_eager=True),
        "engine-instrumented": lambda: run_engine(True),
    }
    runs, medians, _ = run_rotating(timers, args.repeats, args.quiet)
    instrumented = runs["engine-instrumented"]
    steps = statistics.median(r["steps"] for r in instrumented)

    def per_step_ms(values: list[float]) -> float:
        return 1e3 * statistics.median(values) / steps

    phase_ms, native_ms, calls = {}, {}, {}
    for phase in (*PHASES, "bookkeeping"):
        if phase == "bookkeeping":
            totals = [r["seconds"] - sum(r["phase_seconds"].values()) for r in instrumented]
        else:
            totals = [r["phase_seconds"].get(phase, 0.0) for r in instrumented]
        phase_ms[phase] = per_step_ms(totals)
        native_ms[phase] = per_step_ms([r["native_seconds"].get(phase, 0.0) for r in instrumented])
        calls[phase] = statistics.median(r["native_calls"].get(phase, 0) for r in instrumented) / steps
    hf_rate, engine_rate, eager_rate = medians["hf-generate"], medians["engine"], medians["engine-eager"]
    engine_step_ms = 1e3 * statistics.median(r["seconds"] for r in runs["engine"]) / steps
    tokens = statistics.median(r["tokens"] for r in runs["engine"])
    budget_ms = 1e3 * tokens / (TARGET_OVER_HF * hf_rate) / steps
    native_total = sum(native_ms.values())
    result = {
        "benchmark": "rollout_breakdown",
        "config": vars(args),
        "kernels": "aligned-native",
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": list(os.getloadavg()),
        "runs": runs,
        "steps": steps,
        "median_tokens_per_s": {"hf-generate": hf_rate, "engine": engine_rate, "engine-eager": eager_rate},
        "ratio_engine_over_hf": engine_rate / hf_rate,
        "ratio_engine_eager_over_hf": eager_rate / hf_rate,
        "ratio_step_graphs_over_eager": engine_rate / eager_rate,
        "step_graphs": runs["engine"][-1]["step_graphs"],
        "target_engine_over_hf": TARGET_OVER_HF,
        "engine_ms_per_step": engine_step_ms,
        "budget_ms_per_step": budget_ms,
        "instrumentation_overhead": statistics.median(r["seconds"] for r in instrumented)
        / statistics.median(r["seconds"] for r in runs["engine"]),
        "phase_ms_per_step": phase_ms,
        "native_ms_per_step_by_phase": native_ms,
        "native_calls_per_step_by_phase": calls,
        "native_ms_per_step": native_total,
        "outside_native_ms_per_step": sum(phase_ms.values()) - native_total,
        "outside_native_budget_ms_per_step": budget_ms - native_total,
        "provenance": provenance(config=vars(args)),
    }
    if args.out:
        atomic_write_json(Path(args.out), result)
    print(
        f"{args.model} {args.dtype}: engine {engine_rate:.0f} tok/s = {engine_rate / hf_rate:.2f}x HF "
        f"({hf_rate:.0f} tok/s); {engine_step_ms:.3f} ms/step, budget for {TARGET_OVER_HF:g}x HF "
        f"{budget_ms:.3f} ms/step"
    )
    graphs = result["step_graphs"]
    print(
        f"step graphs: {engine_rate / eager_rate:.2f}x the eager engine ({eager_rate / hf_rate:.2f}x HF); "
        + (f"{graphs['captures']} captures, {graphs['replays']} replays a generate" if graphs["enabled"]
           else f"off: {graphs['disabled_reason']}")
    )  # fmt: skip
    print(f"{'phase':12s} {'ms/step':>8s} {'in C':>8s} {'outside C':>10s} {'C calls':>8s}")
    for phase in (*PHASES, "bookkeeping"):
        print(
            f"{phase:12s} {phase_ms[phase]:8.3f} {native_ms[phase]:8.3f} "
            f"{phase_ms[phase] - native_ms[phase]:10.3f} {calls[phase]:8.1f}"
        )
    print(
        f"native C {native_total:.3f} ms/step of the {budget_ms:.3f} budget leaves "
        f"{budget_ms - native_total:.3f} ms/step for everything outside C "
        f"(now {result['outside_native_ms_per_step']:.3f}, instrumented "
        f"x{result['instrumentation_overhead']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
