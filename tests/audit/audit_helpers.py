"""Helpers for the audit tests: a copy of the real claims registry plus synthetic run directories.

Imported as a top-level module (tests/ has no __init__.py).

Synthetic runs follow the layout the experiments write (results/reproduced/<experiment>/<scale>/<run>/
with metrics.jsonl, summary.json, provenance.json); their numbers are made up for the tests and
never leave tmp_path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "results" / "published"


def run_make_all(results: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``paper_figures/make_all.py --results RESULTS --quiet`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, str(REPO / "paper_figures" / "make_all.py"), "--results", str(results), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def write_run(
    results: Path,
    experiment: str,
    scale: str,
    name: str,
    records: list[dict] | None = None,
    summary: dict | None = None,
    provenance: dict | None = None,
) -> Path:
    run = results / "reproduced" / experiment / scale / name
    run.mkdir(parents=True, exist_ok=True)
    if records is not None:
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    prov = provenance or {
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "command_line": ["experiments/" + experiment + "/launch.py", "--scale", scale],
        "config_hash": "feedfacecafebeef",
        "hardware": {"cpu_model": "test CPU", "cpu_count": 2, "cuda": False},
        "packages": {"torch": "2.13.0"},
    }
    (run / "provenance.json").write_text(json.dumps(prov))
    return run


def seal_run(run: Path, commit: str | None = None, config: dict | None = None) -> Path:
    """Make a synthetic run pass the audit's integrity checks, as a real run would: a config.json
    whose hash is the provenance's config_hash, ``commit`` (when given) as its git_commit, and a
    manifest.json written last."""
    from zeromismatch._provenance import config_hash
    from zeromismatch.manifest import write_manifest

    config = config if config is not None else {"run": run.name, "steps": 120}
    (run / "config.json").write_text(json.dumps(config))
    prov = json.loads((run / "provenance.json").read_text())
    prov["config_hash"] = config_hash(config)
    if commit is not None:
        prov["git_commit"] = commit
    (run / "provenance.json").write_text(json.dumps(prov))
    write_manifest(run)
    return run


def git(cwd: Path, *args: str) -> str:
    """``git ARGS`` in ``cwd`` with a throwaway identity; its stdout."""
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def write_benchmark(results: Path, name: str, data: dict) -> Path:
    path = results / "reproduced" / "benchmarks" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def deepseek_records(steps: int = 120, aligned_zero: bool = True) -> list[dict]:
    """Per-step records with 'arm.metric' keys: aligned diffs zero, default diffs and KL growing."""
    records = []
    for step in range(steps):
        diff = 0.0 if aligned_zero else 1e-7
        records.append(
            {
                "step": step,
                "aligned.diff_max": diff,
                "aligned.diff_mean": 0.0,
                "aligned.diff_std": 0.0,
                "aligned.k3_kl": 0.0,
                "aligned.reward_mean": 0.2 + 0.001 * step,
                "default.diff_max": 1e-3 * (1 + step),
                "default.k3_kl": 1e-4 * (1 + step),
                "default.reward_mean": 0.2 + 0.002 * step,  # rises: the 'reward fell' claim is not reproduced
            }
        )
    return records
