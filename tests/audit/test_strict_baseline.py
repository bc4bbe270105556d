"""``zm audit --strict``: which committed verdicts it holds the current ones to.

make_all.py rewrites results/verdicts.json before the audit runs (``make reproduce``), so the
baseline must be the file as committed at git HEAD; the working-tree file only when there is no
git or the file is not tracked; and an explicit ``--committed`` path must exist.
"""

from __future__ import annotations

import json
import subprocess

from audit_helpers import deepseek_records, git, seal_run, write_run

from zeromismatch.audit.registry import load_registry
from zeromismatch.audit.verdicts import evaluate_all, verdicts_document
from zeromismatch.cli import main

EXP = "deepseek_v4_flash_100steps"
CLAIM = "S1-dsv4-zero-diff-every-step"


def _write_verdicts(results, path=None):
    verdicts = evaluate_all(load_registry(results), results)
    (path or results / "verdicts.json").write_text(json.dumps(verdicts_document(verdicts)))


def _git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


def _sealed_run_in_git(results):
    """A repository whose first commit (the "code") made run-a, sealed as a real run is."""
    _git(results.parent, "init", "-q")
    _git(results.parent, "add", "results/published")
    _git(results.parent, "commit", "-qm", "claims")
    run = write_run(results, EXP, "mini", "run-a", records=deepseek_records(120))
    return seal_run(run, commit=git(results.parent, "rev-parse", "HEAD").strip())


def _regress(run):
    bad = deepseek_records(120)
    bad[3]["aligned.diff_max"] = 1e-9
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))


def test_missing_committed_path_is_an_error(results, capsys):
    missing = results / "nope" / "verdicts.json"
    assert main(["audit", "--results", str(results), "--strict", "--committed", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--committed {missing}: no such file" in err
    assert err.count("\n") == 1  # one message, no traceback, no "nothing to hold"


def test_baseline_is_git_head_even_after_make_all_rewrote_the_working_tree(results, capsys):
    run = _sealed_run_in_git(results)
    _write_verdicts(results)
    _git(results.parent, "add", "results")
    _git(results.parent, "commit", "-qm", "verdicts")
    _regress(run)
    _write_verdicts(results)  # what make_all.py does first in `make reproduce`
    assert json.loads((results / "verdicts.json").read_text())["claims"][CLAIM]["verdict"] == "not-reproduced"
    assert main(["audit", "--results", str(results), "--strict"]) == 1
    err = capsys.readouterr().err
    assert "baseline: " in err and "verdicts.json at git HEAD " in err
    assert f"{CLAIM}: committed reproduced-exact, now not-reproduced" in err
    # the explicit override still wins: the rewritten working-tree file holds no verdict against itself;
    # the edited run still fails the integrity checks, whatever the baseline
    explicit = str(results / "verdicts.json")
    assert main(["audit", "--results", str(results), "--strict", "--committed", explicit]) == 1
    err = capsys.readouterr().err
    assert f"baseline: {explicit} (--committed)" in err
    assert "committed reproduced-exact" not in err
    assert f"reproduced/{EXP}/mini/run-a/metrics.jsonl: contents differ" in err


def test_untracked_verdicts_fall_back_to_the_working_tree(results, capsys):
    run = _sealed_run_in_git(results)
    _git(results.parent, "add", "results")
    _git(results.parent, "commit", "-qm", "run-a")
    _write_verdicts(results)  # present, never committed
    assert main(["audit", "--results", str(results), "--strict"]) == 0
    assert "(working tree: no git, or the file is not committed)" in capsys.readouterr().err
    _regress(run)
    assert main(["audit", "--results", str(results), "--strict"]) == 1


def test_without_git_or_file_there_is_nothing_to_hold(results, capsys):
    assert main(["audit", "--results", str(results), "--strict"]) == 0
    assert "no verdicts file at git HEAD or at" in capsys.readouterr().err
