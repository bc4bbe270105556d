"""``zm audit``: every published claim with its verdict, from ``results/`` only.

``--strict`` compares with the committed ``results/verdicts.json`` (written by
``paper_figures/make_all.py``) and exits 1 when a committed reproduced-* verdict no longer holds.
``--contract`` prints what data each claim reads (run keys, metric series, benchmark keys), i.e.
what an experiment must write for its claims to be judged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("audit", help="published claims vs reproduced results: verdict table")
    p.add_argument("--experiment", default=None, help="only this experiment's claims")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 if a committed reproduced-* verdict no longer holds"
    )
    p.add_argument("--results", default=None, help="results directory (default: the repository's results/)")
    p.add_argument(
        "--committed",
        default=None,
        help="verdicts file to compare with under --strict (default: results/verdicts.json)",
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


def run(args) -> int:
    from ..audit.registry import AuditInputError, default_results_root, load_registry, read_json
    from ..audit.verdicts import evaluate_all, strict_regressions

    results_root = Path(args.results) if args.results else default_results_root()
    try:
        registry = load_registry(results_root)
        if args.experiment and args.experiment not in registry.experiments:
            known = ", ".join(registry.experiments)
            print(f"zm audit: unknown experiment {args.experiment!r}; known: {known}", file=sys.stderr)
            return 2
        if args.contract:
            print_contract(registry, args.experiment)
            return 0
        verdicts = evaluate_all(registry, results_root, args.experiment)
        committed = None
        if args.strict:
            committed_path = Path(args.committed) if args.committed else results_root / "verdicts.json"
            if committed_path.exists():
                committed = read_json(committed_path, "verdicts file")
                if not isinstance(committed, dict) or not isinstance(committed.get("claims", {}), dict):
                    raise AuditInputError(
                        f"malformed verdicts file {committed_path}: expected {{'claims': {{...}}}}"
                    )
    except AuditInputError as err:
        print(f"zm audit: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([v.as_dict() for v in verdicts], indent=2, sort_keys=True))
    else:
        print_table(registry, verdicts)
    if not args.strict:
        return 0
    if committed is None:
        print("zm audit --strict: no committed verdicts file; nothing to hold", file=sys.stderr)
        return 0
    if args.experiment:
        committed = {
            "claims": {
                cid: entry
                for cid, entry in committed.get("claims", {}).items()
                if isinstance(entry, dict) and entry.get("experiment") == args.experiment
            }
        }
    problems = strict_regressions(verdicts, committed)
    for problem in problems:
        print(f"zm audit --strict: {problem}", file=sys.stderr)
    return 1 if problems else 0
