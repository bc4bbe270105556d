"""Tamper evidence: do the files under ``results/`` still hold what the runs that made them wrote?

Checked for every *run directory* under ``results/reproduced/`` (a directory not under a hidden name,
``checkpoints/`` or ``wandb/``, holding config.json, metrics.jsonl, summary.json or provenance.json --
the directories the audit reads, at any depth: each ``seed<k>/`` of a seeded arm is one, as are the
learnability seeds, while the seeded arm directory itself holds no run files and is none):

- ``manifest.json`` is present and every file matches its sha256 there (:mod:`zeromismatch.manifest`);
- ``provenance.json`` is present and a JSON object;
- ``config.json`` is present and its parsed contents hash (``_provenance.config_hash``) to the
  ``config_hash`` the provenance records -- the last restart's when the run was resumed, since a
  resume rewrites config.json;
- every commit recorded (``git_commit`` of the provenance, of each restart, and of each postprocess
  in ``summary.json``'s ``derived_provenance`` with its inputs) is a full commit hash that exists in
  the git repository holding the results directory. ``unknown`` (git could not be asked) and a
  ``-dirty`` suffix (the code had uncommitted changes) are findings of their own.

And for the results directory as a whole: every committed data file equals git HEAD (a modified or
deleted file is a finding). The report outputs ``paper_figures/make_all.py`` regenerates from that
data (REPORT.md, report.html, verdicts.json, figures/) are left out of this comparison: make_all.py
rewrites them before ``make reproduce`` runs the audit.

Findings are merged per file: one line per file, named relative to the results directory. When the
results directory is in no git repository, or the repository has no commit, the git checks cannot
be made; that is a *note*, not a finding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .._provenance import config_hash
from ..manifest import SKIPPED_DIRS, is_run_dir, manifest_problems

# written by paper_figures/make_all.py from the data files: compared by what they say (verdicts), not bytes
GENERATED = ("REPORT.md", "report.html", "verdicts.json", "figures/")
_FULL_HASH = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_STATED = " (stated by "  # _provenance.git_state: "<sha> (stated by ZEROMISMATCH_GIT_COMMIT; local git: ...)"
_GIT_TIMEOUT_S = 60


@dataclass
class Integrity:
    findings: list[str] = field(default_factory=list)  # one line per file: "<path>: <what>; <what>"
    notes: list[str] = field(default_factory=list)  # checks that could not be made, and why


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None


def git_toplevel(results_root: Path) -> Path | None:
    """The git work tree holding ``results_root``, or None (no git, or not inside a repository)."""
    done = _git(results_root, "rev-parse", "--show-toplevel")
    if done is None or done.returncode != 0 or not done.stdout.strip():
        return None
    return Path(done.stdout.strip())


class _Commits:
    """Whether a recorded git_commit names a commit of the repository (answers cached per hash)."""

    def __init__(self, repo: Path | None):
        self.repo = repo
        self._exists: dict[str, bool] = {}

    def exists(self, sha: str) -> bool:
        if sha not in self._exists:
            done = _git(self.repo, "cat-file", "-e", f"{sha}^{{commit}}") if self.repo else None
            self._exists[sha] = done is not None and done.returncode == 0
        return self._exists[sha]

    def problem(self, value: object) -> str | None:
        """What is wrong with a recorded git_commit, or None when it is a clean, existing commit."""
        if value is None:
            return "no git_commit recorded"
        if not isinstance(value, str):
            return f"git_commit {value!r} is not a string"
        # a stated commit (a copy of the tree run elsewhere) is the run's claim: that is what is checked
        sha = value.split(_STATED, 1)[0].strip()
        if sha in ("", "unknown"):
            return f"git_commit is {value!r}: the commit that produced it was not recorded"
        dirty = sha.endswith("-dirty")
        sha = sha.removesuffix("-dirty")
        if not _FULL_HASH.fullmatch(sha):
            return f"git_commit {value!r} is not a full commit hash"
        if self.repo is not None and not self.exists(sha):
            return f"git_commit {sha} is not a commit of the repository {self.repo}"
        if dirty:
            return f"git_commit {value}: made from code with uncommitted changes"
        return None


def run_dirs(base: Path) -> list[Path]:
    """Every run directory under ``base`` (itself included), sorted; see the module docstring."""
    if not base.is_dir():
        return []
    found = []
    for directory, dirs, _ in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        if is_run_dir(Path(directory)):
            found.append(Path(directory))
    return sorted(found)


def _read_object(path: Path) -> tuple[dict | None, str | None]:
    """(the JSON object in ``path``, None) or (None, why it is not one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        return None, f"unreadable ({err})"
    except json.JSONDecodeError as err:
        return None, f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    return data, None


def _config_problem(run: Path, provenance: dict) -> tuple[str, str] | None:
    """(file, problem) when config.json does not hash to the provenance's config_hash."""
    record = provenance
    restarts = provenance.get("restarts")
    if isinstance(restarts, list) and restarts and isinstance(restarts[-1], dict):
        record = restarts[-1]  # a resume rewrote config.json (keys a resume may change can differ)
    recorded = record.get("config_hash")
    if not isinstance(recorded, str) or not recorded:
        return "provenance.json", "records no config_hash, so config.json cannot be checked"
    path = run / "config.json"
    if not path.is_file():
        return "config.json", f"missing (provenance.json records config_hash {recorded})"
    config, why = _read_object(path)
    if config is None:
        return "config.json", why
    actual = config_hash(config)
    if actual != recorded:
        return "config.json", f"hashes to {actual}, but provenance.json records config_hash {recorded}"
    return None


def _recorded_commits(provenance: dict | None, summary: dict | None) -> list[tuple[str, str, object]]:
    """(file, where in it, commit) for every commit a run records."""
    found: list[tuple[str, str, object]] = []
    if provenance is not None:
        found.append(("provenance.json", "", provenance.get("git_commit")))
        restarts = provenance.get("restarts")
        for index, restart in enumerate(restarts if isinstance(restarts, list) else []):
            commit = restart.get("git_commit") if isinstance(restart, dict) else None
            found.append(("provenance.json", f"restarts[{index}] ", commit))
    derived = summary.get("derived_provenance") if summary is not None else None
    for key, record in sorted(derived.items()) if isinstance(derived, dict) else []:
        if not isinstance(record, dict):
            continue
        found.append(("summary.json", f"derived_provenance[{key!r}] ", record.get("git_commit")))
        inputs = record.get("inputs")
        for name, commit in sorted(inputs.items()) if isinstance(inputs, dict) else []:
            if commit is not None:  # an input without provenance.json records none: its own check says so
                found.append(("summary.json", f"derived_provenance[{key!r}] input {name} ", commit))
    return found


def check_run(run: Path, commits: _Commits) -> list[tuple[str, str]]:
    """(file relative to ``run``, problem) for one run directory."""
    problems = list(manifest_problems(run))
    provenance = None
    if not (run / "provenance.json").is_file():
        problems.append(("provenance.json", "missing: who made this run, from which commit, is not recorded"))
    else:
        provenance, why = _read_object(run / "provenance.json")
        if provenance is None:
            problems.append(("provenance.json", why))
    if provenance is not None:
        config = _config_problem(run, provenance)
        if config is not None:
            problems.append(config)
    summary = _read_object(run / "summary.json")[0] if (run / "summary.json").is_file() else None
    seen: set[tuple[str, str]] = set()  # a postprocess records one commit for each value it wrote
    for name, where, commit in _recorded_commits(provenance, summary):
        problem = commits.problem(commit)
        if problem is not None and (name, problem) not in seen:
            seen.add((name, problem))
            problems.append((name, f"{where}{problem}"))
    return problems


def _head_changes(results_root: Path, pathspecs: list[str]) -> tuple[list[tuple[str, str]], str | None]:
    """(path relative to ``results_root``, how it changed) for each committed file that differs from
    git HEAD, and None; or ([], why the comparison could not be made)."""
    head = _git(results_root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head is None or head.returncode != 0:
        return [], "the repository has no commit at HEAD: committed data not compared with it"
    done = _git(
        results_root, "diff", "--no-renames", "--name-status", "-z", "--relative", "HEAD", "--", *pathspecs
    )
    if done is None or done.returncode != 0:
        why = (done.stderr.strip() or f"exit {done.returncode}") if done is not None else "git did not run"
        return [], f"git diff HEAD failed ({why}): committed data not compared with git HEAD"
    fields = done.stdout.split("\0")
    changes = []
    for status, path in zip(fields[0::2], fields[1::2], strict=False):
        if not path or status.startswith("A"):
            continue  # staged, never committed: not committed data
        if any(path == g or (g.endswith("/") and path.startswith(g)) for g in GENERATED):
            continue
        how = {"D": "deleted", "M": "modified", "T": "changed type"}.get(status[:1], f"changed ({status})")
        changes.append((path, f"{how} since git HEAD {head.stdout.strip()[:12]} (not committed)"))
    return changes, None


def _experiment_pathspecs(registry, experiment: str) -> list[str]:
    """The committed files one experiment's verdicts read: its claims file, runs and benchmarks."""
    specs = [f"published/{experiment}.json", f"reproduced/{experiment}"]
    for claim in registry.for_experiment(experiment):
        test = claim.get("test") or {}
        if test.get("data") == "benchmark":
            name = test["benchmark"]
            specs += [f"reproduced/benchmarks/{name}.json", f"reproduced/benchmarks/{name}.provenance.json"]
    return specs


def check_results(results_root: Path, registry=None, experiment: str | None = None) -> Integrity:
    """Every finding about ``results_root`` (only ``experiment``'s runs and files when given)."""
    results_root = Path(results_root)
    base = results_root / "reproduced" / experiment if experiment else results_root / "reproduced"
    repo = git_toplevel(results_root)
    result = Integrity()
    if repo is None:
        result.notes.append(
            f"{results_root} is not in a git repository: recorded commits and committed data not verified"
        )
    commits = _Commits(repo)
    by_file: dict[str, list[str]] = {}
    for run in run_dirs(base):
        rel = run.relative_to(results_root).as_posix()
        for name, problem in check_run(run, commits):
            by_file.setdefault(f"{rel}/{name}", []).append(problem)
    if repo is not None:
        pathspecs = _experiment_pathspecs(registry, experiment) if experiment and registry else ["."]
        changes, why = _head_changes(results_root, pathspecs)
        if why:
            result.notes.append(why)
        for path, how in changes:
            by_file.setdefault(path, []).append(how)
    result.findings = [f"{path}: {'; '.join(problems)}" for path, problems in sorted(by_file.items())]
    return result
