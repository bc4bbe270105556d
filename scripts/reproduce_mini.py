"""Run every mini-scale reproduction that exists, then the ratio benchmarks.

Each experiment folder with a ``launch.py`` is run as
``python experiments/<name>/launch.py --scale mini``; results land in
``results/reproduced/<name>/mini/`` (arms already done are skipped). Then the
learnability suite (every env, several seeds) writes ``results/reproduced/learnability/``, and the
benchmarks that published claims point at write ``results/reproduced/benchmarks/``.
A failing step is reported and the others still run; the exit code is non-zero if
any failed.

    python scripts/reproduce_mini.py [--only NAME ...] [--no-benchmarks] [--no-learnability] [--quiet]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from zeromismatch.audit.benchmarks import PRESET_ROLLOUTS, breakdown_file

ROOT = Path(__file__).resolve().parents[1]


def discover() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "experiments").glob("*/launch.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="NAME", help="experiment folder names to run"
    )
    parser.add_argument("--quiet", action="store_true", help="pass --quiet to each launcher")
    parser.add_argument("--no-benchmarks", action="store_true", help="skip benchmarks/*.py")
    parser.add_argument("--no-learnability", action="store_true", help="skip scripts/learnability.py")
    args = parser.parse_args(argv)
    known = [p.name for p in discover()]
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        parser.error(f"unknown --only name(s) {unknown}; known: {', '.join(known)}")
    experiments = [p for p in discover() if args.only is None or p.name in args.only]
    quiet = ["--quiet"] if args.quiet else []
    steps = [(exp.name, [str(exp / "launch.py"), "--scale", "mini", *quiet]) for exp in experiments]
    if not args.no_learnability and args.only is None:
        steps.append(("learnability", ["scripts/learnability.py", *quiet]))
    if not args.no_benchmarks and args.only is None:
        b = ROOT / "results" / "reproduced" / "benchmarks"
        per_preset = [
            (f"benchmark rollout {preset}", ["--model", preset, "--out", str(b / f"rollout_{preset}.json")])
            for preset in PRESET_ROLLOUTS
        ]
        steps += [
            ("benchmark rollout", ["benchmarks/rollout.py", "--out", str(b / "rollout.json"), *quiet]),
            *((name, ["benchmarks/rollout.py", *args_, *quiet]) for name, args_ in per_preset),
            *(
                (
                    f"benchmark rollout breakdown {preset}",
                    [
                        "benchmarks/rollout_breakdown.py",
                        "--model",
                        preset,
                        "--out",
                        str(b / breakdown_file(preset)),
                        *quiet,
                    ],
                )
                for preset in ("tiny-qwen3", *PRESET_ROLLOUTS)
            ),
            ("benchmark async", ["benchmarks/async.py", "--out", str(b / "async.json"), *quiet]),
            ("benchmark ops", ["benchmarks/ops.py", "--threads", "1", "--out", str(b / "ops.json"), *quiet]),
        ]
    if not steps:
        print("no mini reproductions found under experiments/*/launch.py")
        return 0
    failed = []
    for name, script in steps:
        cmd = [sys.executable, *script]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        print(f"== {name}: exit {rc} after {time.perf_counter() - start:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
