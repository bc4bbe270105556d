"""Rebuild every figure and the claims report from ``results/`` only.

Reads ``results/published/`` (the claims) and ``results/reproduced/`` (runs and benchmarks);
writes ``results/figures/*.png``, ``results/REPORT.md``, ``results/report.html`` and
``results/verdicts.json``. No network, no GPU, no wandb; a claim without data is reported
as not-run. Every input is checked and every output built in a staging directory before any old
output is replaced (``zeromismatch.audit.report.build_all``): a malformed input is one message
(exit 2) and leaves the previous report, verdicts and figures as they were. So is an output that
could not be written (a results directory that is not writable, a ``figures`` that is a file, a
``REPORT.md`` that is a directory): checked before any input is read or figure drawn.
Usage: ``python paper_figures/make_all.py [--results DIR] [--quiet]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def check_outputs(results: str | None) -> None:
    """ValueError naming ``--results`` when one of the outputs could not be written there: the
    publish step replaces them one by one, so a late failure would leave a mixed old/new report."""
    from zeromismatch.audit import default_results_root
    from zeromismatch.audit.figures import FIGURES_DIR
    from zeromismatch.audit.report import REPORT_HTML, REPORT_MD, VERDICTS_JSON
    from zeromismatch.io import check_directory_path, check_file_path

    root = Path(results) if results is not None else default_results_root()
    check_directory_path(root, "--results")  # the staging directory is made in it
    check_directory_path(root / FIGURES_DIR, "--results")
    for name in (VERDICTS_JSON, REPORT_HTML, REPORT_MD):
        check_file_path(root / name, "--results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", default=None, help="results directory (default: results/ of this script's checkout)"
    )
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    args = parser.parse_args(argv)

    from zeromismatch.audit import AuditInputError, build_all
    from zeromismatch.checkout import use_checkout

    try:
        if args.results is None:  # this file's checkout: not the cwd's, nor the imported package's
            args.results = str(use_checkout(__file__) / "results")
        check_outputs(args.results)
    except ValueError as err:
        print(f"make_all: {err}", file=sys.stderr)
        return 2
    try:
        build_all(args.results, quiet=args.quiet)
    except AuditInputError as err:
        print(f"make_all: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
