"""The published-claims registry: schema validity, coverage of every digest number, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from audit_helpers import PUBLISHED, REPO

from zeromismatch.audit.registry import (
    EXPERIMENTS,
    AuditInputError,
    evaluate_formula,
    load_registry,
)

DIGEST = REPO / "docs" / "sources.md"


@pytest.fixture(scope="module")
def registry():
    return load_registry(REPO / "results")


def test_schema_is_valid_json_schema_and_every_file_validates():
    schema = json.loads((PUBLISHED / "schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    files = sorted(p for p in PUBLISHED.glob("*.json") if p.name != "schema.json")
    assert {p.stem for p in files} == set(EXPERIMENTS)
    for path in files:
        cls(schema).validate(json.loads(path.read_text()))


def test_schema_enum_matches_experiment_ids():
    schema = json.loads((PUBLISHED / "schema.json").read_text())
    assert tuple(schema["$defs"]["experiment_id"]["enum"]) == EXPERIMENTS


def test_registry_loads_with_unique_ids_and_one_publication_per_source(registry):
    ids = [c["id"] for c in registry.claims]
    assert len(ids) == len(set(ids))
    pubs = {}
    for claim in registry.claims:
        pubs.setdefault(claim["source"]["id"], set()).add(claim["source"]["publication"])
        assert claim["id"].startswith(claim["source"]["id"] + "-")
    assert set(pubs) == {"S1", "S2", "S3"}
    assert all(len(p) == 1 for p in pubs.values())


def test_every_claim_has_a_test_with_command_or_an_out_of_reach_reason(registry):
    for claim in registry.claims:
        if "test" in claim:
            assert claim["test"]["command"].startswith("python ")
        else:
            assert claim["out_of_reach"]["needs"]


def _registry_numbers(registry) -> tuple[set[float], set[str]]:
    numbers, strings = set(), set()
    for claim in registry.claims:
        for value in claim["values"]:
            if isinstance(value["value"], str):
                strings.add(value["value"])
            else:
                numbers.add(float(value["value"]))
            for alt in value.get("alternatives", []):
                numbers.add(float(alt["value"]))
        scale = claim["published_scale"]
        if scale.get("gpus"):
            numbers.add(float(scale["gpus"]))
        if scale.get("updates"):
            numbers.add(float(scale["updates"]["value"]))
    return numbers, strings


def test_every_bold_number_of_the_digest_is_in_the_registry(registry):
    """Each number the digest puts in bold is a value, alternative or scale of some claim."""
    text = DIGEST.read_text(encoding="utf-8")
    number = re.compile(r"(?<![\w.@-])(\d[\d,]*(?:\.\d+)*(?:e-?\d+)?)(?:x|%|\s?h\b|\s?s\b)?(?![\w-])")
    numbers, strings = _registry_numbers(registry)
    found = []
    for span in re.findall(r"\*\*(.+?)\*\*", text, flags=re.S):
        if span.startswith("Fix "):
            continue  # section headings "Fix 1 ... Fix 4", not results
        for match in number.finditer(span):
            token = match.group(1)
            found.append(token)
            if token.count(".") > 1:
                assert token in strings, f"version {token} from digest span {span!r} not in the registry"
            else:
                assert float(token.replace(",", "")) in numbers, f"{token} ({span!r}) not in the registry"
    # The digest's headline numbers, named explicitly so a digest edit cannot empty this test.
    for must in [
        "2e-3",
        "29.9",
        "91.3",
        "0.56",
        "0.23",
        "0.22",
        "442.54",
        "68.55",
        "164.77",
        "2.40",
        "0.0555",
    ]:
        assert must in found


def test_specific_records_as_required(registry):
    claims = registry.by_id()
    kl = {v["name"]: v for v in claims["S1-dsv4base-kl-2e-3-to-29.9"]["values"]}
    assert kl["kl_before"]["value"] == 2e-3 and kl["kl_after"]["value"] == 29.9
    swe = claims["S1-nemotron-baseline-0.56-to-0.23"]
    after = next(v for v in swe["values"] if v["name"] == "swebench_pro_baseline_after")
    assert after["value"] == 0.23 and after["alternatives"][0]["value"] == 0.22
    assert "0.22" in swe["discrepancy"] and "0.23" in swe["discrepancy"]
    thr = {v["name"]: v for v in claims["S3-async-throughput-2.40x"]["values"]}
    assert thr["wall_time_async"]["value"] == 68.55 and thr["wall_time_sync"]["value"] == 164.77
    assert thr["async_over_sync_throughput"]["derived"]["formula"] == "164.77 / 68.55"
    assert round(evaluate_formula("164.77 / 68.55"), 2) == 2.40
    zero = claims["S1-dsv4-zero-diff-every-step"]["test"]
    assert zero["rule"] == "exact" and zero["min_steps"] == 101
    assert {op["metric"] for op in zero["exact_zero"]} == {"diff_max", "diff_mean", "diff_std", "k3_kl"}
    for out in ("S1-dsv41-zero-diff", "S3-coverage-kimi-k3.1", "S3-coverage-amd-mi355x"):
        assert "out_of_reach" in claims[out]


def test_formula_evaluator_refuses_anything_but_arithmetic():
    assert evaluate_formula("1 - 10 / 100") == pytest.approx(
        0.9
    )  # float arithmetic; exact equality not the point
    with pytest.raises(ValueError):
        evaluate_formula("__import__('os')")


def _rewrite(results: Path, experiment: str, edit) -> Path:
    path = results / "published" / f"{experiment}.json"
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


def test_invalid_json_is_one_error_naming_the_file(results):
    bad = results / "published" / "osworld_step_time.json"
    bad.write_text('{"experiment": "osworld_step_time", ')
    with pytest.raises(
        AuditInputError, match=r"malformed claims file .*osworld_step_time\.json.*invalid JSON"
    ):
        load_registry(results)


def test_schema_violation_names_file_and_location(results):
    def drop_metric(doc):
        del doc["claims"][0]["metric"]

    _rewrite(results, "qwen3_30b_a3b_tools", drop_metric)
    with pytest.raises(
        AuditInputError, match=r"qwen3_30b_a3b_tools\.json: at claims/0: 'metric' is a required"
    ):
        load_registry(results)


def test_claim_needs_exactly_one_of_test_and_out_of_reach(results):
    def add_reach(doc):
        doc["claims"][0]["out_of_reach"] = {"reason": "x" * 30, "needs": ["a GPU"]}

    _rewrite(results, "qwen3_30b_a3b_tools", add_reach)
    with pytest.raises(AuditInputError, match=r"qwen3_30b_a3b_tools\.json"):
        load_registry(results)


def test_derived_value_must_match_its_formula(results):
    def corrupt(doc):
        for claim in doc["claims"]:
            for value in claim["values"]:
                if value["name"] == "async_over_sync_throughput":
                    value["value"] = 2.5
                    value.pop("number_as_written")

    _rewrite(results, "reinforce_zero_lag64", corrupt)
    with pytest.raises(
        AuditInputError, match=r"reinforce_zero_lag64\.json.*formula 164\.77 / 68\.55 gives 2\.4"
    ):
        load_registry(results)


def test_duplicate_claim_id_across_files_is_rejected(results):
    def dup(doc):
        doc["claims"][0]["id"] = "S1-dsv4-zero-diff-every-step"
        doc["claims"][0]["source"]["id"] = "S1"
        doc["claims"][0]["source"]["publication"] = json.loads(
            (PUBLISHED / "deepseek_v4_flash_100steps.json").read_text()
        )["claims"][0]["source"]["publication"]

    _rewrite(results, "qwen3_30b_a3b_tools", dup)
    with pytest.raises(AuditInputError, match="already used"):
        load_registry(results)


def test_agg_all_outside_exact_zero_is_rejected(results):
    def misuse(doc):
        doc["claims"][0]["test"]["checks"][0]["lhs"]["agg"] = "all"

    _rewrite(results, "osworld_step_time", misuse)
    with pytest.raises(AuditInputError, match="agg 'all' is only allowed in exact_zero"):
        load_registry(results)


def test_number_as_written_must_agree(results):
    def corrupt(doc):
        for claim in doc["claims"]:
            for value in claim["values"]:
                if value.get("number_as_written") == "1.50":
                    value["number_as_written"] = "1.05"

    _rewrite(results, "reinforce_zero_lag64", corrupt)
    with pytest.raises(AuditInputError, match="number_as_written"):
        load_registry(results)


def test_factor_needs_an_operand_rhs(results):
    def misuse(doc):
        check = doc["claims"][0]["test"]["checks"][0]
        check["rhs"], check["factor"] = 1.0, 2

    _rewrite(results, "osworld_step_time", misuse)
    with pytest.raises(AuditInputError, match="has a factor but its rhs is a number"):
        load_registry(results)


def _add_rule_change(words: str):
    def edit(doc):
        claim = next(c for c in doc["claims"] if c.get("test"))
        claim["test"]["rule_changes"] = [
            {"change": "reads the fast arm instead of the default arm", "claim_words": words,
             "why": "the claim is about that arm"},
        ]  # fmt: skip

    return edit


def test_a_rule_change_must_quote_the_claims_own_words(results):
    _rewrite(results, "osworld_step_time", _add_rule_change("words the claim never says"))
    with pytest.raises(AuditInputError, match="quotes 'words the claim never says', which is not in"):
        load_registry(results)


def test_a_rule_change_quoting_the_statement_loads(results):
    statement = json.loads((PUBLISHED / "osworld_step_time.json").read_text())["claims"][0]["statement"]
    _rewrite(results, "osworld_step_time", _add_rule_change("  ".join(statement.split()[:4])))
    load_registry(results)
