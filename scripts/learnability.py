"""Run the learnability suite (issue 6): SFT warm start -> RL -> held-out pass@1, every env, several seeds.

Results land in ``results/reproduced/learnability/<case>/seed<k>/``; finished runs are skipped unless
``--force``. ``paper_figures/make_all.py`` renders them into the report. See
``zeromismatch.expt.learnability`` for the cases and why there are several seeds.

    python scripts/learnability.py [--cases tools_lag64,desktop] [--seeds 0 1 2] [--force] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from zeromismatch.expt.learnability import SEEDS, cases, run_suite, select

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--out-root", default=None, help="default: results/reproduced/learnability")
    parser.add_argument("--force", action="store_true", help="rerun finished runs")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or per-run lines")
    args = parser.parse_args(argv)
    if args.out_root:
        # A file in the way would otherwise surface as a traceback after the first run trained.
        out_root = Path(args.out_root)
        existing = next((p for p in (out_root, *out_root.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            parser.error(f"--out-root {out_root}: {existing} exists and is not a directory")
    try:
        chosen = select(args.cases.split(",") if args.cases else None, cases())
        run_suite(chosen, tuple(args.seeds), args.out_root, args.force, args.quiet)
    except (ValueError, OSError) as err:
        print(f"learnability: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
