"""``zm invariance``: measure a kernel set's bitwise promises on this machine's CPU or GPU.

Runs ``zeromismatch.kernels.selfcheck`` (row, layout, phase, neighbour and chunking checks,
``torch.equal`` over every compared pair) and prints one line per check, or JSON with provenance.
Exit status 0 whatever the checks find, unless ``--expect-identical`` is given: then 1 when any
check is not identical (for scripts that gate on the aligned set).

    zm invariance --kernels aligned --device cuda --dtype fp32,bf16 --json --out gpu.json
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("invariance", help="measure a kernel set's bitwise invariances on a CPU or GPU")
    p.add_argument("--kernels", default="aligned", help="kernel set name (default: aligned)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
    p.add_argument("--dtype", default="fp32,bf16", help="comma-separated activation dtypes: fp32, bf16")
    p.add_argument("--only", default="", help="comma-separated ops to check (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0 = torch's default); CPU GEMMs may split by it",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", default="", help="also write the JSON (with provenance) to this file, atomically")
    p.add_argument("--expect-identical", action="store_true", help="exit 1 if any check is not identical")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def run(args) -> int:
    import torch

    from .._provenance import provenance
    from ..io import atomic_write_json
    from ..kernels import get_kernels
    from ..kernels.selfcheck import run_checks

    if args.threads < 0:
        print(f"zm invariance: --threads must be >= 0, got {args.threads}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        print(f"zm invariance: bad --device {args.device!r}: {err}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"zm invariance: --device {args.device} but torch sees no CUDA device", file=sys.stderr)
        return 2
    try:
        kernels = get_kernels(args.kernels)
        progress = None if args.quiet else (lambda label: print(f"  checking {label}", file=sys.stderr))
        results = run_checks(kernels, device, _split(args.dtype), args.seed, _split(args.only), progress)
    except ValueError as err:
        print(f"zm invariance: {err}", file=sys.stderr)
        return 2
    payload = {
        "kernels": args.kernels,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
        "checks": [r.as_dict() for r in results],
        "provenance": provenance(),
    }
    if args.out:
        atomic_write_json(args.out, payload)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(
            f"# kernels={args.kernels} device={device} ({payload['device_name']}) seed={args.seed} "
            f"threads={payload['torch_threads']} torch={torch.__version__}"
        )
        print(f"{'op':20s} {'property':13s} {'dtype':5s} {'identical':9s} {'max|diff|':>10s} pairs")
        for r in results:
            print(
                f"{r.op:20s} {r.prop:13s} {r.dtype:5s} {'yes' if r.identical else 'NO':9s} "
                f"{r.max_abs_diff:10.3g} {r.comparisons}"
            )
    if args.expect_identical and not all(r.identical for r in results):
        return 1
    return 0
