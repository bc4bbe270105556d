"""Rebuild every figure and the claims report from ``results/`` only.

Reads ``results/published/`` (the claims) and ``results/reproduced/`` (runs and benchmarks);
writes ``results/figures/*.png``, ``results/REPORT.md``, ``results/report.html`` and
``results/verdicts.json``. No network, no GPU, no wandb; a claim without data is reported
as not-run. Every input is checked and every output built in a staging directory before any old
output is replaced (``zeromismatch.audit.report.build_all``): a malformed input is one message
(exit 2) and leaves the previous report, verdicts and figures as they were.
Usage: ``python paper_figures/make_all.py [--results DIR] [--quiet]``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", default=None, help="results directory (default: the repository's results/)"
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    args = parser.parse_args(argv)

    from zeromismatch.audit import AuditInputError, build_all

    try:
        build_all(args.results, quiet=args.quiet)
    except AuditInputError as err:
        print(f"make_all: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
