"""``zm invariance``: measure kernel sets' bitwise promises on this machine's CPU or GPU.

Runs ``zeromismatch.kernels.selfcheck`` (row, layout, phase, neighbour and chunking checks,
``torch.equal`` over every compared pair) for every combination of the comma-separated
``--kernels``, ``--device`` and ``--threads`` given, and prints one table per run, or JSON
``{"runs": [...], "provenance": ...}``. Exit status 0 whatever the checks find, unless
``--expect-identical`` is given: then 1 when any check of any run is not identical, or
when no check ran. Exit status 2 for bad input (one message naming the flag).

    zm invariance --kernels aligned,default --device cuda,cpu --threads 1,16 --out node.json
"""

from __future__ import annotations

import itertools
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("invariance", help="measure kernel sets' bitwise invariances on a CPU or GPU")
    p.add_argument("--kernels", default="aligned", help="comma-separated kernel set names (default: aligned)")
    p.add_argument(
        "--device", default="cpu", help="comma-separated torch devices, e.g. cpu,cuda (default: cpu)"
    )
    p.add_argument("--dtype", default="fp32,bf16", help="comma-separated activation dtypes: fp32, bf16")
    p.add_argument(
        "--threads",
        default="0",
        help="comma-separated torch CPU thread counts (0 = torch's default); CPU GEMMs may split by it",
    )
    p.add_argument("--only", default="", help="comma-separated ops to check (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", default="", help="also write the JSON (with provenance) to this file, atomically")
    p.add_argument("--expect-identical", action="store_true", help="exit 1 if any check is not identical")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _parse(args):
    """(kernel sets, devices, dtypes, thread counts) from the arguments; ValueError names what is wrong."""
    from ..argtypes import parse_device
    from ..io import check_file_path
    from ..kernels import get_kernels
    from ..kernels.aligned.gemm import check_gemm_environment
    from ..kernels.selfcheck import DTYPES, SEED_LIMIT

    # the checks' GEMMs and the provenance read these variables: a bad one fails now, for every kernel
    # set (the default set's GEMMs never read the tile rows, so it would fail only at the provenance)
    check_gemm_environment()
    kernels = [get_kernels(name) for name in _split(args.kernels)]
    devices = [parse_device(text) for text in _split(args.device)]
    dtypes = _split(args.dtype)
    if not dtypes:
        raise ValueError(f"--dtype needs at least one of {', '.join(DTYPES)}")
    unknown = sorted(set(dtypes) - set(DTYPES))
    if unknown:
        raise ValueError(f"--dtype: unknown dtype(s) {unknown}; choose from {sorted(DTYPES)}")
    if not 0 <= args.seed < SEED_LIMIT:
        raise ValueError(f"--seed must be in [0, {SEED_LIMIT}), got {args.seed}")
    try:
        threads = [int(t) for t in _split(args.threads)]
    except ValueError:
        raise ValueError(f"--threads must be comma-separated integers, got {args.threads!r}") from None
    if not kernels or not devices or not threads or any(t < 0 for t in threads):
        raise ValueError("--kernels, --device and --threads each need at least one value (threads >= 0)")
    if args.out:  # checked now: a bad --out would otherwise only fail once every check has run
        check_file_path(args.out, "--out")
    return kernels, devices, dtypes, threads


def _print_run(run: dict) -> None:
    print(
        f"# kernels={run['kernels']} device={run['device']} ({run['device_name']}) seed={run['seed']} "
        f"threads={run['torch_threads']} torch={run['torch']}"
    )
    print(f"{'op':20s} {'property':13s} {'dtype':5s} {'identical':9s} {'max|diff|':>10s} pairs")
    for r in run["checks"]:
        print(
            f"{r['op']:20s} {r['prop']:13s} {r['dtype']:5s} {'yes' if r['identical'] else 'NO':9s} "
            f"{r['max_abs_diff']:10.3g} {r['comparisons']}"
        )


def run(args) -> int:
    import torch

    from .._provenance import provenance
    from ..io import atomic_write_json
    from ..kernels.selfcheck import run_checks

    saved_threads = torch.get_num_threads()
    progress = None if args.quiet else (lambda label: print(f"  checking {label}", file=sys.stderr))
    runs = []
    try:
        kernels, devices, dtypes, threads = _parse(args)
        for kernel_set, device, count in itertools.product(kernels, devices, threads):
            torch.set_num_threads(count or saved_threads)
            results = run_checks(kernel_set, device, dtypes, args.seed, _split(args.only), progress)
            runs.append(
                {
                    "kernels": kernel_set.name,
                    "device": str(device),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "seed": args.seed,
                    "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "checks": [r.as_dict() for r in results],
                }
            )
    except ValueError as err:
        print(f"zm invariance: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(saved_threads)
    payload = {"runs": runs, "provenance": provenance()}
    if args.out:
        atomic_write_json(args.out, payload)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        for one in runs:
            _print_run(one)
    checks = [c for one in runs for c in one["checks"]]
    if args.expect_identical and not (checks and all(c["identical"] for c in checks)):
        if not checks:  # nothing measured is no evidence of identity
            print("zm invariance: --expect-identical but no check ran", file=sys.stderr)
        return 1
    return 0
