"""The published-claims registry: ``results/published/<experiment>.json``, validated.

Each file holds the claims of one experiment (see ``results/published/schema.json``). Loading
validates every file against that JSON Schema, then runs the checks a schema cannot express:

- claim ids are unique across files, and each claim's ``experiment`` equals its file's;
- one source id names one publication everywhere;
- a derived value equals its formula (evaluated from published numbers only, rounded as stated);
- operands fit the test's data: ``benchmark_key`` only with ``data: benchmark``, ``summary`` and
  ``metric`` only with ``data: run``; ``agg: all`` only inside ``exact_zero``;
- a check's ``min_z`` (noise floor, see :mod:`.verdicts`) only with op ``> >= < <=`` and either
  both sides a ``mean``/``head_mean``/``tail_mean`` of a metrics series (the per-step values give
  its standard error) or both sides ``over_seeds`` (the per-seed values give it), never one of each;
- ``over_seeds`` (the mean over an arm's ``seed<k>/`` runs, see :mod:`.seeds`) only with an ``arm``
  to read the seeds of; ``min_seeds`` only with ``over_seeds``;
- every ``rule_changes`` entry quotes words that occur verbatim in the claim's ``statement``
  (whitespace-normalised): a rule changes only to follow what the claim says.

Any violation raises :class:`AuditInputError` naming the file. Nothing here reads reproduced data.
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path

EXPERIMENTS = (
    "deepseek_v4_flash_100steps",
    "nemotron_nvfp4_swebench",
    "qwen3_30b_a3b_tools",
    "osworld_step_time",
    "reinforce_zero_lag64",
    "pipelinerl_v0_v1",
)
SCHEMA_NAME = "schema.json"


class AuditInputError(ValueError):
    """A claims file, run directory or benchmark file is malformed; the message names the file."""


def default_results_root() -> Path:
    """``results/`` of the checkout in use (``zeromismatch.checkout``: the running script's, else the
    cwd's), never the installed package's; outside any checkout one AuditInputError naming --results."""
    from ..checkout import NoCheckoutError, results_root

    try:
        return results_root()
    except NoCheckoutError as err:
        raise AuditInputError(str(err)) from err


@dataclass
class Registry:
    """All published claims, in file order (experiment files sorted by name)."""

    claims: list[dict]
    experiments: dict[str, dict] = field(default_factory=dict)  # experiment id -> file header
    files: dict[str, Path] = field(default_factory=dict)  # experiment id -> claims file

    def by_id(self) -> dict[str, dict]:
        return {claim["id"]: claim for claim in self.claims}

    def for_experiment(self, experiment: str) -> list[dict]:
        return [claim for claim in self.claims if claim["experiment"] == experiment]


def read_json(path: Path, what: str) -> object:
    """Parse a JSON file; any failure is one :class:`AuditInputError` naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise AuditInputError(f"cannot read {what} {path}: {err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise AuditInputError(
            f"malformed {what} {path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
        ) from err


def load_schema(published_dir: Path) -> dict:
    schema = read_json(published_dir / SCHEMA_NAME, "claims schema")
    if not isinstance(schema, dict):
        raise AuditInputError(f"malformed claims schema {published_dir / SCHEMA_NAME}: not a JSON object")
    return schema


_VALIDATORS: dict[str, object] = {}


def _validator(schema: dict):
    # Checking the schema against its meta-schema dominates load time; do it once per schema text.
    import jsonschema

    key = json.dumps(schema, sort_keys=True)
    if key not in _VALIDATORS:
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as err:
            raise AuditInputError(f"malformed claims schema: {err.message}") from err
        _VALIDATORS[key] = cls(schema)
    return _VALIDATORS[key]


def validate_claims_file(path: Path, document: object, schema: dict) -> None:
    """Schema-validate one claims document; the error names the file and the JSON path."""
    validator = _validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise AuditInputError(f"malformed claims file {path}: at {where}: {first.message}{more}")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_formula(formula: str) -> float:
    """Evaluate an arithmetic formula over numeric literals (+ - * / and parentheses only)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"formula {formula!r} may only use numbers, + - * / and parentheses")

    return walk(ast.parse(formula, mode="eval"))


def iter_operands(test: dict):
    """Yield ``(place, operand)`` for every operand of a test; place is 'exact_zero' or 'check'."""
    for operand in test.get("exact_zero", []):
        yield "exact_zero", operand
    for check in test.get("checks", []):
        yield "check", check["lhs"]
        if isinstance(check["rhs"], dict):
            yield "check", check["rhs"]


NOISE_AGGS = ("mean", "head_mean", "tail_mean")


def _check_min_z(path: Path, cid: str, check: dict) -> None:
    """``min_z`` needs a standard error and a direction to test: both sides means of per-step
    series (steps as samples), or both sides over seeds (seeds as samples)."""
    where = f"malformed claims file {path}: claim {cid}: check {check['label']!r} has min_z"
    if check["op"] == "==":
        raise AuditInputError(f"{where} but op '=='; min_z tests a direction (> >= < <=)")
    seeded = {side: isinstance(check[side], dict) and "over_seeds" in check[side] for side in ("lhs", "rhs")}
    if all(seeded.values()):
        return
    for side in ("lhs", "rhs"):
        if seeded[side]:
            raise AuditInputError(
                f"{where} but only its {side} is over seeds; its samples must be alike on both sides "
                f"(both over_seeds: seeds as samples; neither: steps as samples)"
            )
    for side in ("lhs", "rhs"):
        operand = check[side]
        if not isinstance(operand, dict) or operand.get("agg") not in NOISE_AGGS or "abs_dev_from" in operand:
            raise AuditInputError(
                f"{where} but its {side} is not a mean of a metrics series "
                f"(agg {', '.join(NOISE_AGGS)}, no abs_dev_from)"
            )


def _check_claim(path: Path, experiment: str, claim: dict, publications: dict[str, str]) -> None:
    cid = claim["id"]
    if claim["experiment"] != experiment:
        raise AuditInputError(
            f"malformed claims file {path}: claim {cid} says experiment {claim['experiment']!r}, "
            f"the file is for {experiment!r}"
        )
    source = claim["source"]
    known = publications.setdefault(source["id"], source["publication"])
    if known != source["publication"]:
        raise AuditInputError(
            f"malformed claims file {path}: claim {cid} names publication {source['publication']!r} "
            f"for {source['id']}, other claims name {known!r}"
        )
    for value in claim["values"]:
        written = value.get("number_as_written")
        if written is not None and float(written.replace(",", "")) != value["value"]:
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid} value {value['name']} = {value['value']!r} "
                f"but number_as_written is {written!r}"
            )
        derived = value.get("derived")
        if derived is None:
            continue
        try:
            computed = evaluate_formula(derived["formula"])
        except (ValueError, SyntaxError, ZeroDivisionError) as err:
            raise AuditInputError(f"malformed claims file {path}: claim {cid}: {err}") from err
        digits = derived.get("round_to")
        expected = round(computed, digits) if digits is not None else computed
        if not isinstance(value["value"], int | float) or abs(expected - value["value"]) > 1e-12 * max(
            1.0, abs(expected)
        ):
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid} value {value['name']} = {value['value']!r} "
                f"but its formula {derived['formula']} gives {expected!r}"
            )
    test = claim.get("test")
    if test is None:
        return
    statement = " ".join(claim["statement"].split())
    for entry in test.get("rule_changes", []):
        if " ".join(entry["claim_words"].split()) not in statement:
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid}: rule change {entry['change']!r} quotes "
                f"{entry['claim_words']!r}, which is not in the claim's statement"
            )
    for check in test.get("checks", []):
        if "factor" in check and not isinstance(check["rhs"], dict):
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid}: check {check['label']!r} has a factor but "
                f"its rhs is a number; write the scaled number instead"
            )
    for place, operand in iter_operands(test):
        if "benchmark_key" in operand and test["data"] != "benchmark":
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid} uses benchmark_key in a test on run data"
            )
        if ("summary" in operand or "metric" in operand) and test["data"] != "run":
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid} uses a run operand in a benchmark test"
            )
        if operand.get("agg") == "all" and place != "exact_zero":
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid}: agg 'all' is only allowed in exact_zero"
            )
        if "over_seeds" in operand and not operand.get("arm"):
            raise AuditInputError(
                f"malformed claims file {path}: claim {cid}: over_seeds needs an arm (its seeds are "
                f"<arm>/seed<k>/ dirs)"
            )
        if "min_seeds" in operand and "over_seeds" not in operand:
            raise AuditInputError(f"malformed claims file {path}: claim {cid}: min_seeds without over_seeds")
    for check in test.get("checks", []):
        if "min_z" in check:
            _check_min_z(path, cid, check)


def load_registry(results_root: str | Path | None = None) -> Registry:
    """Load and validate every ``results/published/<experiment>.json``."""
    root = Path(results_root) if results_root is not None else default_results_root()
    published = root / "published"
    if not published.is_dir():
        raise AuditInputError(f"no published-claims directory at {published}")
    schema = load_schema(published)
    registry = Registry(claims=[])
    publications: dict[str, str] = {}
    seen: dict[str, Path] = {}
    for path in sorted(published.glob("*.json")):
        if path.name == SCHEMA_NAME:
            continue
        document = read_json(path, "claims file")
        validate_claims_file(path, document, schema)
        experiment = document["experiment"]
        if path.stem != experiment:
            raise AuditInputError(f"malformed claims file {path}: holds experiment {experiment!r}")
        for claim in document["claims"]:
            if claim["id"] in seen:
                first = seen[claim["id"]]
                raise AuditInputError(
                    f"malformed claims file {path}: claim id {claim['id']} already used in {first}"
                )
            seen[claim["id"]] = path
            _check_claim(path, experiment, claim, publications)
            registry.claims.append(claim)
        registry.experiments[experiment] = {k: v for k, v in document.items() if k != "claims"}
        registry.files[experiment] = path
    if not registry.claims:
        raise AuditInputError(f"no claims files in {published}")
    return registry
