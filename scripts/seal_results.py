"""Write ``manifest.json`` (sha256 of every data file, see ``zeromismatch.manifest``) into every run
directory under ``results/reproduced/`` that has none, for runs made before runs sealed themselves.

A run directory whose manifest exists and matches is left alone. One whose manifest no longer matches
its files is reported and left alone too, and the script exits 1: sealing it again would make an
edited file look like what the run wrote. ``--reseal`` rewrites those as well, for when the change
is known to be legitimate (say, a postprocess that wrote a summary without updating the manifest).
Nothing but manifest.json files is written.

    python scripts/seal_results.py [--results DIR] [--reseal] [--dry-run]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zeromismatch.audit.integrity import run_dirs
from zeromismatch.manifest import MANIFEST, check_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "results"), help="results directory")
    parser.add_argument("--reseal", action="store_true", help="also rewrite manifests that no longer match")
    parser.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    args = parser.parse_args(argv)

    results = Path(args.results)
    written = kept = refused = 0
    for run in run_dirs(results / "reproduced"):
        rel = run.relative_to(results).as_posix()
        if (run / MANIFEST).is_file():
            problems = check_manifest(run)
            if not problems:
                kept += 1
                continue
            if not args.reseal:
                refused += 1
                for problem in problems:
                    print(f"{rel}/{problem}: not resealed (--reseal to overwrite)", file=sys.stderr)
                continue
        if not args.dry_run:
            write_manifest(run)
        written += 1
        print(f"{'would seal' if args.dry_run else 'sealed'} {rel}/{MANIFEST}")
    print(f"{written} written, {kept} already matching, {refused} not matching and left alone")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
