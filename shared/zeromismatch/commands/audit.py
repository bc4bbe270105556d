"""``zm audit``: every published claim with its verdict, from ``results/`` only.

``--strict`` compares with the committed ``results/verdicts.json`` (written by
``paper_figures/make_all.py``) and exits 1 when a committed reproduced-* verdict no longer holds.
Its baseline is the file as committed at git HEAD (``git show HEAD:./verdicts.json`` in the
results directory), because ``make_all.py`` -- the first thing ``make reproduce`` runs before the
audit -- rewrites the working-tree copy from the same data the audit judges. Without git, or when
the file is not tracked at HEAD, the working-tree file is the baseline. ``--committed PATH``
names the baseline explicitly (a missing PATH is an error). The output says which was used.
``--contract`` prints what data each claim reads (run keys, metric series, benchmark keys), i.e.
what an experiment must write for its claims to be judged.

Every audit also checks that the run files are what their runs wrote (:mod:`..audit.integrity`:
manifests, provenance, config hashes, recorded commits, committed data vs git HEAD) and prints one
line per file found wanting on stderr; ``--strict`` exits 1 on any such finding as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("audit", help="published claims vs reproduced results: verdict table")
    p.add_argument("--experiment", default=None, help="only this experiment's claims")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a committed reproduced-* verdict no longer holds, or a run's files fail the "
        "integrity checks (manifest, provenance, config hash, commit, committed data vs git HEAD)",
    )
    p.add_argument(
        "--results", default=None, help="results directory (default: results/ of the checkout the cwd is in)"
    )
    p.add_argument(
        "--committed",
        default=None,
        help="verdicts file to compare with under --strict (default: results/verdicts.json as "
        "committed at git HEAD, else the working-tree file)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable verdicts")
    p.add_argument("--contract", action="store_true", help="print the data each claim reads, then exit")
    p.set_defaults(func=run)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _operand_text(operand: dict) -> str:
    if "summary" in operand:
        text = f"summary.json {operand['summary']}"
    elif "benchmark_key" in operand:
        text = f"[{operand['benchmark_key']!r}]"
    else:
        text = f"metrics.jsonl {operand['metric']} ({operand['agg']})"
    if "abs_dev_from" in operand:
        text = f"|{text} - {operand['abs_dev_from']:g}|"
    return f"arm {operand['arm']}: {text}" if operand.get("arm") else text


def print_contract(registry, experiment: str | None) -> None:
    from ..audit.registry import iter_operands

    print(
        "# 'arm A: <file> k' is read as key 'A.k' in the run's own file (metrics records may instead carry\n"
        "# \"arm\": \"A\" and key 'k'), else as key 'k' in <run>/A/<file>; a scale directory whose runs are\n"
        "# named by arm (mini/aligned/, mini/default/) is judged as one group.\n"
        "# head_mean/tail_mean = mean of the first/last 10% of recorded steps; 'all' = every step;\n"
        "# a+b = per-step sum. A claim is judged on the first candidate (full > mini, then run\n"
        "# name descending, then the scale group) recording every key it lists. Keys: literal, else a\n"
        "# dotted path into nested objects."
    )
    for claim in registry.claims:
        if experiment and claim["experiment"] != experiment:
            continue
        test = claim.get("test")
        if test is None:
            print(f"{claim['id']}: out of reach ({'; '.join(claim['out_of_reach']['needs'])})")
            continue
        if test["data"] == "benchmark":
            where = f"reproduced/benchmarks/{test['benchmark']}.json"
        else:
            scales = "|".join(test.get("scales", ["full", "mini"]))
            where = f"reproduced/{claim['experiment']}/<{scales}>/<run>/"
        operands = sorted({_operand_text(op) for _, op in iter_operands(test)})
        print(f"{claim['id']}: {where}")
        for text in operands:
            print(f"    {text}")
        print(f"    produced by: {test['command']}")


def print_table(registry, verdicts) -> None:
    from ..audit.text import measured_short, next_step, published_short, repro_scale_text

    claims = registry.by_id()
    header = f"{'claim':44s} {'verdict':21s} {'published':36s} {'our scale':18s} measured / next step"
    print(header)
    print("-" * len(header))
    for v in verdicts:
        detail = measured_short(v) if v.measured else next_step(v)
        published = _clip(published_short(claims[v.claim_id]), 36)
        print(
            f"{_clip(v.claim_id, 44):44s} {v.verdict:21s} {published:36s} "
            f"{_clip(repro_scale_text(v), 18):18s} {_clip(detail, 90)}"
        )


VERDICTS_FILE = "verdicts.json"


def _git_head_file(results_root: Path) -> tuple[str, str] | None:
    """(text, short commit) of ``<results_root>/verdicts.json`` at git HEAD; None without git or file."""
    try:
        shown = subprocess.run(
            ["git", "show", f"HEAD:./{VERDICTS_FILE}"],
            cwd=results_root,
            capture_output=True,
            text=True,
            timeout=30,
        )
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=results_root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if shown.returncode != 0 or head.returncode != 0:
        return None
    return shown.stdout, head.stdout.strip()


def _verdicts_document(document: object, where: str) -> dict:
    from ..audit.registry import AuditInputError

    if not isinstance(document, dict) or not isinstance(document.get("claims", {}), dict):
        raise AuditInputError(f"malformed verdicts file {where}: expected {{'claims': {{...}}}}")
    return document


def load_baseline(results_root: Path, explicit: str | None) -> tuple[dict | None, str]:
    """The verdicts ``--strict`` holds the current ones to, and a sentence saying where they came from.

    ``explicit`` (``--committed``) must exist; otherwise git HEAD's copy, else the working tree's,
    else (None, why there is none).
    """
    from ..audit.registry import AuditInputError, read_json

    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise AuditInputError(f"--committed {path}: no such file")
        return _verdicts_document(read_json(path, "verdicts file"), str(path)), f"{path} (--committed)"
    path = Path(results_root) / VERDICTS_FILE
    at_head = _git_head_file(Path(results_root)) if Path(results_root).is_dir() else None
    if at_head is not None:
        text, commit = at_head
        where = f"{path} at git HEAD {commit}"
        try:
            document = json.loads(text)
        except json.JSONDecodeError as err:
            raise AuditInputError(f"malformed verdicts file {where}: invalid JSON: {err.msg}") from err
        return _verdicts_document(document, where), where
    if path.is_file():
        where = f"{path} (working tree: no git, or the file is not committed)"
        return _verdicts_document(read_json(path, "verdicts file"), str(path)), where
    return None, f"no verdicts file at git HEAD or at {path}"


def run(args) -> int:
    from ..audit.integrity import check_results
    from ..audit.registry import AuditInputError, default_results_root, load_registry
    from ..audit.verdicts import evaluate_all, strict_regressions

    try:  # outside any checkout, default_results_root is one AuditInputError naming --results
        results_root = Path(args.results) if args.results else default_results_root()
        registry = load_registry(results_root)
        if args.experiment and args.experiment not in registry.experiments:
            known = ", ".join(registry.experiments)
            print(f"zm audit: unknown experiment {args.experiment!r}; known: {known}", file=sys.stderr)
            return 2
        if args.contract:
            print_contract(registry, args.experiment)
            return 0
        verdicts = evaluate_all(registry, results_root, args.experiment)
        committed, baseline = None, ""
        if args.strict:
            committed, baseline = load_baseline(results_root, args.committed)
    except AuditInputError as err:
        print(f"zm audit: {err}", file=sys.stderr)
        return 2
    integrity = check_results(results_root, registry, args.experiment)
    if args.json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=2, sort_keys=True))
    else:
        print_table(registry, verdicts)
    prefix = "zm audit --strict" if args.strict else "zm audit"
    for note in integrity.notes:
        print(f"{prefix}: not checked: {note}", file=sys.stderr)
    if not args.strict:
        for finding in integrity.findings:
            print(f"{prefix}: {finding}", file=sys.stderr)
        return 0
    problems = []
    if committed is None:
        print(f"zm audit --strict: {baseline}; no verdicts to hold", file=sys.stderr)
    else:
        print(f"zm audit --strict: baseline: {baseline}", file=sys.stderr)
        if args.experiment:
            committed = {
                "claims": {
                    cid: entry
                    for cid, entry in committed.get("claims", {}).items()
                    if isinstance(entry, dict) and entry.get("experiment") == args.experiment
                }
            }
        problems = strict_regressions(verdicts, committed)
    for problem in [*problems, *integrity.findings]:
        print(f"zm audit --strict: {problem}", file=sys.stderr)
    return 1 if problems or integrity.findings else 0
