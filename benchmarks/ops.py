"""Per-op speed of the aligned kernel set relative to the default set on this CPU.

For each op at tiny-model shapes (hidden 256-1024, batch 1-64 decode rows, sequences up
to 512 prefill rows) the two sets run on the same inputs, interleaved, and the table
reports median microseconds per call, aligned/default time and the throughput ratio
(aligned throughput as a fraction of default; >= 0.9x is the target, the published
aligned stacks run at 0.42x-0.913x). Cases from ``benchmarks/ops_sequence_cases.py``
(attention, MoE, SSM; ``CASES: list[OpCase]``) are appended when that module exists.
Case format and timing method: benchmarks/timing.py.

Usage: ``python benchmarks/ops.py [--quiet] [--only linear,rms_norm] [--repeats 15]
[--threads 2] [--clock wall|cpu] [--out results/reproduced/benchmarks/ops.json]``; it prints the
table and writes JSON only with ``--out``. On an
oversubscribed host, 2-thread OpenMP timings collapse onto scheduler quanta (many rows read
~12 or ~16 ms on both sides); ``--threads 1`` is the steadier view there, and at one thread
the clock defaults to this thread's CPU time (``--clock cpu``, see benchmarks/timing.py), so
time spent descheduled by other jobs counts for neither side. More threads: wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import OpCase, format_table, measure, summarize  # noqa: E402

from zeromismatch.argtypes import check_out_or_exit, device_or_exit, int_at_least  # noqa: E402
from zeromismatch.audit.benchmarks import NATIVE_SUFFIX  # noqa: E402
from zeromismatch.kernels import get_kernels  # noqa: E402
from zeromismatch.kernels.quant import quantize_fp8, quantize_nvfp4  # noqa: E402

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _case(name, desc, make, fn):
    """fn(kernels, *inputs) runs the op; the same inputs feed both sets."""
    return OpCase(
        name,
        desc,
        make,
        lambda inp: fn(ALIGNED, *inp),
        lambda inp: fn(DEFAULT, *inp),
        lambda ks, inp: fn(ks, *inp),
    )


def _gemm_cases(name, prefix, dt, shapes, rows, fn) -> list[OpCase]:
    """One case per (K, N) in ``shapes`` and M in ``rows``: x [M, K], weight [N, K] in dtype ``dt``."""
    dtype = DT[dt]
    return [
        _case(
            name,
            f"{prefix}M={m} K={k} N={n} {dt}",
            lambda m=m, k=k, n=n: (_rand(m, k, dtype=dtype), _rand(n, k, dtype=dtype, seed=1)),
            fn,
        )
        for k, n in shapes
        for m in rows
    ]


def dense_cases() -> list[OpCase]:
    cases: list[OpCase] = []
    for dt in ("fp32", "bf16"):
        dtype = DT[dt]
        cases += _gemm_cases(
            "linear", "", dt, ((256, 256), (1024, 1024), (1024, 3072), (3072, 1024)), (1, 4, 16, 64, 512),
            lambda ks, x, w: ks.linear(x, w),
        )  # fmt: skip
        # hidden 256 (o_proj of 4 heads x 64) and hidden 1024
        cases += _gemm_cases(
            "row_parallel_linear", "TP1 V=4 ", dt, ((256, 256), (1024, 1024)), (1, 16, 512),
            lambda ks, x, w: ks.row_parallel_linear(x, w),
        )  # fmt: skip
        for h in (256, 1024):
            for m in (1, 64, 512):
                cases.append(
                    _case(
                        "rms_norm",
                        f"M={m} H={h} {dt}",
                        lambda m=m, h=h, dtype=dtype: (
                            _rand(m, h, dtype=dtype),
                            _rand(h, dtype=dtype, seed=1),
                        ),
                        lambda ks, x, w: ks.rms_norm(x, w, 1e-6),
                    )
                )
        for m in (1, 64, 512):
            cases.append(
                _case(
                    "gated_rms_norm",
                    f"M={m} H=1024 groups=8 {dt}",
                    lambda m=m, dtype=dtype: (
                        _rand(m, 1024, dtype=dtype),
                        _rand(m, 1024, dtype=dtype, seed=1),
                        _rand(1024, dtype=dtype, seed=2),
                    ),
                    lambda ks, x, g, w: ks.gated_rms_norm(x, g, w, 1e-5, 128),
                )
            )
            cases.append(
                _case(
                    "rope",
                    f"T={m} H=8 D=64 {dt}",
                    lambda m=m, dtype=dtype: (
                        _rand(m, 8, 64, dtype=dtype),
                        torch.arange(m),
                        1.0 / (10000 ** (torch.arange(32) / 32.0)),
                    ),
                    lambda ks, x, p, f: ks.rope(x, p, f),
                )
            )
            for inter in (1024, 3072):
                cases.append(
                    _case(
                        "silu_mul",
                        f"M={m} I={inter} {dt}",
                        lambda m=m, i=inter, dtype=dtype: (
                            _rand(m, i, dtype=dtype),
                            _rand(m, i, dtype=dtype, seed=1),
                        ),
                        lambda ks, g, u: ks.silu_mul(g, u),
                    )
                )
            cases.append(
                _case(
                    "relu2",
                    f"M={m} I=3072 {dt}",
                    lambda m=m, dtype=dtype: (_rand(m, 3072, dtype=dtype),),
                    lambda ks, x: ks.relu2(x),
                )
            )
        for vocab in (4096, 32000):
            for m in (1, 16, 64):
                cases.append(
                    _case(
                        "lm_head",
                        f"M={m} H=1024 V={vocab} {dt}",
                        lambda m=m, v=vocab, dtype=dtype: (
                            _rand(m, 1024, dtype=dtype),
                            _rand(v, 1024, dtype=dtype, seed=1, scale=0.05),
                        ),
                        lambda ks, h, w: ks.lm_head(h, w),
                    )
                )
    for vocab in (4096, 32000):
        for m in (1, 64):
            cases.append(
                _case(
                    "log_softmax",
                    f"M={m} V={vocab} fp32",
                    lambda m=m, v=vocab: (_rand(m, v, scale=3.0),),
                    lambda ks, x: ks.log_softmax(x),
                )
            )
            cases.append(
                _case(
                    "processed_log_softmax",
                    f"M={m} V={vocab} t=0.8 k=50 p=0.9",
                    lambda m=m, v=vocab: (
                        _rand(m, v, scale=3.0),
                        torch.full((m,), 0.8),
                        torch.full((m,), 50),
                        torch.full((m,), 0.9),
                    ),
                    lambda ks, x, t, k, p: ks.processed_log_softmax(x, t, k, p),
                )
            )
    weight = _rand(1024, 1024, seed=3, scale=0.05)
    qweights = {
        "fp8": quantize_fp8(weight),
        "fp8-block": quantize_fp8(weight, (128, 128)),
        "nvfp4": quantize_nvfp4(weight),
    }
    for fmt, qw in qweights.items():
        for m in (1, 16, 64):
            for dt in ("fp32", "bf16"):
                cases.append(
                    _case(
                        "quant_linear",
                        f"{fmt} M={m} K=N=1024 {dt}",
                        lambda m=m, dtype=DT[dt], qw=qw: (_rand(m, 1024, dtype=dtype), qw),
                        lambda ks, x, q: ks.quant_linear(x, q),
                    )
                )
    return cases


#: why ops_sequence_cases left out its aligned-native rows (None: they ran, or no such module)
_native_not_run: str | None = None


def sequence_cases(dense: list[OpCase] = ()) -> list[OpCase]:
    """ops_sequence_cases' cases, then the aligned-native twins of ``dense`` (the ops in
    ops_sequence_cases._NATIVE_OPS: linear, quant_linear, lm_head, row_parallel_linear, rms_norm,
    gated_rms_norm, rope)."""
    global _native_not_run
    path = Path(__file__).resolve().parent / "ops_sequence_cases.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("ops_sequence_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    twins = module.native_twins(list(dense))
    _native_not_run = module.NATIVE_NOT_RUN
    return list(module.CASES) + twins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--only", default="", help="comma-separated op names to run")
    parser.add_argument("--repeats", type=int_at_least(1), default=15)
    parser.add_argument("--out", default="", help="write the timings as JSON here")
    parser.add_argument(
        "--threads",
        type=int_at_least(0),
        default=0,
        help="torch threads (0 = default); 1 is steadier on a loaded host",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default=None,
        help="wall time or this thread's CPU time (default: cpu at --threads 1, else wall)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device to time on (inputs are built on the CPU and moved; wall clock, synchronized)",
    )
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)  # before any measuring
    device = device_or_exit(parser, args.device)
    if device.type != "cpu" and args.clock == "cpu":
        parser.error(f"--clock cpu cannot time a {device.type} device")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    clock = args.clock or ("cpu" if torch.get_num_threads() == 1 and device.type == "cpu" else "wall")
    if clock == "cpu" and torch.get_num_threads() != 1:
        parser.error("--clock cpu measures one thread; use it with --threads 1")
    dense = dense_cases()
    cases = dense + sequence_cases(dense)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = sorted(wanted - {c.name for c in cases})
        if unknown:
            parser.error(f"--only: unknown op(s) {unknown}; known: {sorted({c.name for c in cases})}")
        cases = [c for c in cases if c.name in wanted]
    timings, failures = [], []
    for case in tqdm(cases, disable=args.quiet, desc="ops"):
        if device.type == "cpu":
            timings.append(measure(case, repeats=args.repeats, clock=clock))
            continue
        # on another device a case that cannot run there is reported, not fatal: the CPU is the
        # platform these kernels are written for, and the point of a device run is to find out
        try:
            timings.append(measure(case, repeats=args.repeats, clock=clock, device=args.device))
        except Exception as err:  # noqa: BLE001 - reported per case below
            failures.append(
                {"op": case.name, "shape": case.shape_desc, "error": f"{type(err).__name__}: {err}"}
            )
    where = f"device {device}" if device.type != "cpu" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; medians of {args.repeats} interleaved samples, {clock} clock")
    for failure in failures:
        print(f"FAILED on {device}: {failure['op']} {failure['shape']}: {failure['error'][:300]}")
    print(format_table(timings))
    print()
    print(summarize(timings))
    if failures and not timings:
        print(f"every case failed on {device}; nothing was measured", file=sys.stderr)
        return 1
    if args.out:
        from zeromismatch._provenance import provenance
        from zeromismatch.io import atomic_write_json

        atomic_write_json(
            Path(args.out),
            {
                "threads": torch.get_num_threads(),
                "device": str(device),
                "failures": failures,
                "clock": clock,
                "torch": torch.__version__,
                "provenance": provenance(config=vars(args)),
                "native_not_run": _native_not_run,
                "cases": [
                    {
                        "op": t.name,
                        # rows named *_native time the aligned-native set (the report's NATIVE_SUFFIX)
                        "kernels": "aligned-native" if t.name.endswith(NATIVE_SUFFIX) else "aligned",
                        "shape": t.shape_desc,
                        "aligned_us": t.aligned_us,
                        "default_us": t.default_us,
                        "throughput_ratio": t.throughput_ratio,
                    }
                    for t in timings
                ],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
