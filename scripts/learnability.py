"""Run the learnability suite (issue 6): SFT warm start -> RL -> held-out pass@1, every env, several seeds.

Results land in ``results/reproduced/learnability/<case>/seed<k>/`` of this script's checkout (or
under ``--out-root``); finished runs are skipped unless ``--force``. ``paper_figures/make_all.py``
renders them into the report. See ``zeromismatch.experiment.learnability`` for the cases and why there are
several seeds.

    python scripts/learnability.py [--cases tools_lag64,desktop] [--seeds 0 1 2] [--force] [--quiet]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from zeromismatch._provenance import freeze_git_state

    # an hour-long suite records the code it started with, whatever is committed meanwhile; the cases
    # are defined in the package (experiment/learnability.py), so the package's checkout is the one
    # whose configs ran
    freeze_git_state()
    from zeromismatch.checkout import use_checkout
    from zeromismatch.experiment.learnability import SEEDS, cases, run_suite, select
    from zeromismatch.io import check_directory_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument(
        "--out-root", default=None, help="default: results/reproduced/learnability of this script's checkout"
    )
    parser.add_argument("--force", action="store_true", help="rerun finished runs")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or per-run lines")
    args = parser.parse_args(argv)
    try:
        if args.out_root:  # a file in the way would otherwise fail only after the first run trained
            check_directory_path(args.out_root, "--out-root")
        else:  # this file's checkout, not the cwd's nor the imported package's
            use_checkout(__file__)
        chosen = select(args.cases.split(",") if args.cases else None, cases())
        run_suite(chosen, tuple(args.seeds), args.out_root, args.force, args.quiet)
    except (ValueError, OSError) as err:
        print(f"learnability: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
