"""Run every mini-scale reproduction that exists, one after another.

Each experiment folder with a ``launch.py`` is run as
``python experiments/<name>/launch.py --scale mini``; results land in
``results/reproduced/<name>/mini/``. A failing experiment is reported and the
others still run; the exit code is non-zero if any failed.

    python scripts/reproduce_mini.py [--only NAME ...] [--quiet]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def discover() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "experiments").glob("*/launch.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="experiment folder names to run")
    parser.add_argument("--quiet", action="store_true", help="pass --quiet to each launcher")
    args = parser.parse_args(argv)
    experiments = [p for p in discover() if args.only is None or p.name in args.only]
    if not experiments:
        print("no mini reproductions found under experiments/*/launch.py")
        return 0
    failed = []
    for exp in experiments:
        cmd = [sys.executable, str(exp / "launch.py"), "--scale", "mini"]
        cmd += ["--quiet"] if args.quiet else []
        print(f"== {exp.name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        print(f"== {exp.name}: exit {rc} after {time.perf_counter() - start:.0f} s", flush=True)
        if rc != 0:
            failed.append(exp.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
