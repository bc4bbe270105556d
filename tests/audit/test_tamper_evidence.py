"""``zm audit --strict`` fails, with one line naming the run and file, when run data were tampered with.

The tree: results/ in a git repository whose first commit (the claims; the "code" the run records
as its git_commit) is followed by a sealed synthetic run (manifest.json, config.json matching the
provenance's config_hash), a data file no claim reads, a generated report, and the verdicts judged
on them. Each test changes one thing and checks the exit status and the line that says why. Some
tamperings are also committed (and the manifest rewritten) to show that the check concerned holds
on its own, without the manifest or git HEAD giving it away.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from audit_helpers import REPO, deepseek_records, git, seal_run, write_benchmark, write_run

from zeromismatch._provenance import config_hash
from zeromismatch.audit.registry import load_registry
from zeromismatch.audit.verdicts import evaluate_all, verdicts_document
from zeromismatch.cli import main
from zeromismatch.manifest import check_manifest, covered_files, write_manifest

EXP = "deepseek_v4_flash_100steps"
REL = f"reproduced/{EXP}/mini/run-a"
SUMMARY = {"steps": 120, "eval_pass_at_1_after": 0.5, "weights_sha256": "ab" * 32}


@pytest.fixture
def tree(results):
    """(results root, run dir, the commit the run records), all committed."""
    git(results.parent, "init", "-q")
    git(results.parent, "add", "results/published")
    git(results.parent, "commit", "-qm", "claims")
    code = git(results.parent, "rev-parse", "HEAD").strip()
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(120), summary=dict(SUMMARY))
    seal_run(run, commit=code)
    write_benchmark(results, "unread", {"x": 1})
    (results / "REPORT.md").write_text("generated\n")
    verdicts = evaluate_all(load_registry(results), results)
    (results / "verdicts.json").write_text(json.dumps(verdicts_document(verdicts)))
    git(results.parent, "add", "results")
    git(results.parent, "commit", "-qm", "run-a")
    return results, run, code


def _audit(results, capsys, *extra) -> tuple[int, list[str]]:
    code = main(["audit", "--results", str(results), *extra])
    return code, capsys.readouterr().err.splitlines()


def _strict(results, capsys, *extra) -> tuple[int, list[str]]:
    """Exit status and the lines that are not the baseline line."""
    code, lines = _audit(results, capsys, "--strict", *extra)
    return code, [line for line in lines if not line.startswith("zm audit --strict: baseline: ")]


def _commit_all(results, message="tampered"):
    git(results.parent, "add", "-A", "results")
    git(results.parent, "commit", "-qm", message)


def _edit_json(path: Path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _one_line(lines: list[str], file: str) -> str:
    """The single finding about ``file``; no other finding, and no verdict regression."""
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"zm audit --strict: {file}: "), line
    return line


def test_the_untampered_tree_passes(tree, capsys):
    results, run, _ = tree
    assert check_manifest(run) == []
    assert _strict(results, capsys) == (0, [])
    assert _audit(results, capsys) == (0, [])  # nothing extra on stderr without findings


def test_a_non_maximum_step_edited_in_metrics(tree, capsys):
    results, run, _ = tree
    records = deepseek_records(120)
    records[3]["default.diff_max"] *= 2  # still far below the last step's: no verdict changes
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, lines = _strict(results, capsys)
    line = _one_line(lines, f"{REL}/metrics.jsonl")
    assert code == 1
    assert "contents differ from their sha256 in manifest.json" in line and "modified since git HEAD" in line
    # a plain audit reports it, exits 0, and prints its table as before
    code, lines = _audit(results, capsys)
    assert code == 0 and lines == [line.replace("zm audit --strict: ", "zm audit: ")]


@pytest.mark.parametrize(
    "change", [{"eval_pass_at_1_after": 0.49}, {"weights_sha256": "0" * 64}], ids=["pass_at_1", "weights"]
)
def test_a_summary_value_edited(tree, capsys, change):
    results, run, _ = tree
    _edit_json(run / "summary.json", **change)
    code, lines = _strict(results, capsys)
    assert code == 1
    assert "contents differ from their sha256 in manifest.json" in _one_line(lines, f"{REL}/summary.json")


def test_provenance_deleted(tree, capsys):
    results, run, _ = tree
    (run / "provenance.json").unlink()
    code, lines = _strict(results, capsys)
    line = _one_line(lines, f"{REL}/provenance.json")
    assert code == 1
    assert "listed in manifest.json but missing" in line and "missing: who made this run" in line
    assert "deleted since git HEAD" in line
    # deleted, resealed and committed: the missing provenance is a finding by itself
    write_manifest(run)
    _commit_all(results)
    code, lines = _strict(results, capsys)
    assert code == 1 and "missing: who made this run" in _one_line(lines, f"{REL}/provenance.json")


def test_a_commit_that_does_not_exist(tree, capsys):
    results, run, _ = tree
    fake = "f" * 40
    _edit_json(run / "provenance.json", git_commit=fake)
    code, lines = _strict(results, capsys)
    line = _one_line(lines, f"{REL}/provenance.json")
    assert (
        code == 1
        and "contents differ" in line
        and f"git_commit {fake} is not a commit of the repository" in line
    )
    write_manifest(run)
    _commit_all(results)
    code, lines = _strict(results, capsys)
    line = _one_line(lines, f"{REL}/provenance.json")
    assert code == 1 and line.endswith(
        f"git_commit {fake} is not a commit of the repository {results.parent}"
    )


@pytest.mark.parametrize(
    ("commit", "says"),
    [
        ("{code}-dirty", "made from code with uncommitted changes"),
        ("unknown", "the commit that produced it was not recorded"),
        ("HEAD", "is not a full commit hash"),  # git would resolve it; a run records a full hash
    ],
)
def test_dirty_unknown_or_symbolic_commits_are_findings(tree, capsys, commit, says):
    results, run, code = tree
    _edit_json(run / "provenance.json", git_commit=commit.format(code=code))
    write_manifest(run)
    _commit_all(results)
    status, lines = _strict(results, capsys)
    assert status == 1 and says in _one_line(lines, f"{REL}/provenance.json")


def test_a_stated_commit_is_checked_as_the_commit_it_states(tree, capsys):
    results, run, code = tree
    stated = f"{code} (stated by ZEROMISMATCH_GIT_COMMIT; local git: unknown)"
    _edit_json(run / "provenance.json", git_commit=stated)
    write_manifest(run)
    _commit_all(results)
    assert _strict(results, capsys) == (0, [])


def test_a_config_that_no_longer_hashes_to_the_provenance(tree, capsys):
    results, run, _ = tree
    _edit_json(run / "config.json", steps=121)
    code, lines = _strict(results, capsys)
    line = _one_line(lines, f"{REL}/config.json")
    assert code == 1 and "contents differ" in line and "but provenance.json records config_hash" in line
    write_manifest(run)
    _commit_all(results)
    code, lines = _strict(results, capsys)
    assert code == 1 and "but provenance.json records config_hash" in _one_line(lines, f"{REL}/config.json")


def test_a_resumed_run_is_checked_against_its_last_restart(tree, capsys):
    results, run, code = tree
    config = {"run": "run-a", "steps": 120, "keep_checkpoints": 3}  # a resume may change this key
    (run / "config.json").write_text(json.dumps(config))
    restart = {"git_commit": code, "config_hash": config_hash(config), "resumed_at_step": 60}
    _edit_json(run / "provenance.json", restarts=[restart])
    write_manifest(run)
    _commit_all(results)
    assert _strict(results, capsys) == (0, [])
    _edit_json(run / "provenance.json", restarts=[{**restart, "git_commit": "e" * 40}])
    write_manifest(run)
    _commit_all(results)
    code, lines = _strict(results, capsys)
    assert code == 1 and "restarts[0] git_commit eeee" in _one_line(lines, f"{REL}/provenance.json")


def test_a_file_added_to_a_run_is_a_finding(tree, capsys):
    results, run, _ = tree
    (run / "notes.txt").write_text("added later\n")
    code, lines = _strict(results, capsys)
    assert code == 1 and "not listed in manifest.json" in _one_line(lines, f"{REL}/notes.txt")


def test_committed_data_outside_runs_must_equal_git_head(tree, capsys):
    results, _, _ = tree
    bench = results / "reproduced" / "benchmarks" / "unread.json"
    bench.write_text(json.dumps({"x": 2}))
    code, lines = _strict(results, capsys)
    assert code == 1 and "modified since git HEAD" in _one_line(lines, "reproduced/benchmarks/unread.json")
    bench.unlink()
    code, lines = _strict(results, capsys)
    assert code == 1 and "deleted since git HEAD" in _one_line(lines, "reproduced/benchmarks/unread.json")


def test_generated_report_and_untracked_files_are_not_committed_data(tree, capsys):
    results, _, _ = tree
    (results / "REPORT.md").write_text("regenerated\n")  # make_all.py rewrites it before the audit runs
    write_benchmark(results, "new", {"x": 1})  # never committed
    assert _strict(results, capsys) == (0, [])


def test_experiment_filter_checks_only_that_experiment(tree, capsys):
    results, run, _ = tree
    _edit_json(run / "summary.json", eval_pass_at_1_after=0.49)
    assert _strict(results, capsys, "--experiment", "osworld_step_time") == (0, [])
    code, lines = _strict(results, capsys, "--experiment", EXP)
    assert code == 1 and len(lines) == 1


def test_without_git_the_git_checks_are_a_note(results, capsys):
    run = seal_run(write_run(results, EXP, "mini", "run-a", records=deepseek_records(120)))
    code, lines = _strict(results, capsys)
    assert code == 0
    assert any("not checked: " in line and "is not in a git repository" in line for line in lines)
    (run / "metrics.jsonl").write_text("")
    code, lines = _strict(results, capsys)
    assert code == 1 and any(line.startswith(f"zm audit --strict: {REL}/metrics.jsonl: ") for line in lines)


def test_the_manifest_covers_data_files_only(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "state.pt").write_bytes(b"x")
    (run / "wandb").mkdir()
    (run / "wandb" / "log").write_text("x")
    (run / ".lock").write_text("pid 1\n")
    (run / "aligned").mkdir()
    (run / "aligned" / "summary.json").write_text("{}")  # an arm: a run directory with its own manifest
    (run / "plots").mkdir()
    (run / "plots" / "curve.csv").write_text("1\n")
    for name in ("config.json", "metrics.jsonl", "summary.json", "provenance.json"):
        (run / name).write_text("{}")
    write_manifest(run)
    assert covered_files(run) == [
        "config.json",
        "metrics.jsonl",
        "plots/curve.csv",
        "provenance.json",
        "summary.json",
    ]
    first = (run / "manifest.json").read_bytes()
    write_manifest(run)
    assert (run / "manifest.json").read_bytes() == first  # deterministic: resealing changes nothing
    assert check_manifest(run) == []
    (run / "plots" / "curve.csv").write_text("2\n")
    assert check_manifest(run) == ["plots/curve.csv: contents differ from their sha256 in manifest.json"]


def test_add_to_summary_reseals_the_run(tmp_path):
    from zeromismatch.experiment.spec import add_to_summary

    run = tmp_path / "arm"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"steps": 3}))
    write_manifest(run)
    add_to_summary(run, {"derived": 1.0})
    assert json.loads((run / "summary.json").read_text())["derived"] == 1.0
    assert check_manifest(run) == []


def _seal_script():
    spec = importlib.util.spec_from_file_location("seal_results", REPO / "scripts" / "seal_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seal_script_seals_unsealed_runs_and_refuses_to_launder_edits(results, capsys):
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(4), summary=dict(SUMMARY))
    other = write_run(results, EXP, "mini", "run-b", records=deepseek_records(4), summary=dict(SUMMARY))
    before = {p: p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()}
    seal = _seal_script()
    assert seal.main(["--results", str(results)]) == 0
    after = {p: p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()}
    assert set(after) - set(before) == {run / "manifest.json", other / "manifest.json"}
    assert all(after[p] == data for p, data in before.items())  # nothing else written
    _edit_json(run / "summary.json", eval_pass_at_1_after=0.49)
    assert seal.main(["--results", str(results)]) == 1
    assert f"{REL}/summary.json: contents differ" in capsys.readouterr().err
    assert check_manifest(run) != []  # left as it was
    assert seal.main(["--results", str(results), "--reseal"]) == 0
    assert check_manifest(run) == []
