"""Every benchmark file the report reads, rewritten one at a time (``make bench``).

The list is ``zeromismatch.audit.benchmark_suite.SUITE`` (the same one ``scripts/reproduce_mini.py``
runs); each script runs alone, in order, with ``--quiet``. Timings: run it on a quiet machine.
The whole suite takes about an hour on two cores, most of it ``alignment_cost.py``'s grid.

Usage: ``python benchmarks/run_all.py [--out results/reproduced/benchmarks] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from zeromismatch.audit.benchmark_suite import BY_NAME, OUT_DIR, SUITE

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT_DIR, help="directory the files are written to")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these files only")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(BY_NAME))
    if unknown:
        parser.error(f"--only: unknown benchmark file(s) {unknown}; choose from {sorted(BY_NAME)}")
    out = Path(args.out).resolve()  # the scripts run from the checkout's root
    out.mkdir(parents=True, exist_ok=True)
    for bench in SUITE:
        if args.only and bench.name not in args.only:
            continue
        print(f"run_all.py: {bench.command(str(out))}", flush=True)
        done = subprocess.run([sys.executable, *bench.argv(str(out)), "--quiet"], cwd=ROOT)
        if done.returncode != 0:
            print(f"run_all.py: {bench.name} failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
