"""Every command reads and writes the checkout it runs in, never the one the package was imported from.

The package under test is this working tree's (an editable install); each test makes a second checkout
in ``tmp_path`` and runs the real entry points there, as a reviewer with another clone would, then checks
that the second checkout got the outputs and this one was not touched or judged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from experiment_helpers import ROOT, git, load, make_checkout

ZM = Path(sys.executable).with_name("zm")
LAUNCH = Path("experiments") / "osworld_step_time" / "launch.py"
NO_DATA = {"not-run", "out-of-reach"}  # the verdicts of a checkout without reproduced runs


def run(argv: list, cwd: Path, ceiling: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ZM_CLUSTER_PROFILES", "ZEROMISMATCH_GIT_COMMIT")}
    # git never looks above ``ceiling`` (the test's tmp_path): a directory outside a checkout stays outside
    # whatever work tree the temporary directory may be in
    env["GIT_CEILING_DIRECTORIES"] = str(ceiling.resolve())
    argv = [str(a) for a in argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its mtime: any write there shows as a difference."""
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.mark.slow
def test_smoke_launch_writes_into_and_records_the_launchers_checkout(tmp_path, elsewhere):
    other = make_checkout(tmp_path / "other")
    head = git(other, "rev-parse", "HEAD")
    configs = other / "experiments" / "osworld_step_time" / "configs.py"
    configs.write_text(configs.read_text() + "\n# an uncommitted edit: these configs are what runs\n")
    arm = load("osworld_step_time").arms_for("smoke")[0].name
    watched = [ROOT / "results" / "reproduced" / "osworld_step_time", ROOT / "runs" / "smoke"]
    before = [snapshot(folder) for folder in watched]
    out = run(
        [sys.executable, other / LAUNCH, "--scale", "smoke", "--arms", arm, "--quiet"], elsewhere, tmp_path
    )
    assert out.returncode == 0, out.stderr
    run_dir = other / "runs" / "smoke" / "osworld_step_time" / "smoke" / arm
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["git_commit"] == f"{head}-dirty"  # the edited configs of this checkout ran
    assert Path(provenance["package_checkout"]["path"]).is_relative_to(ROOT)  # and this checkout's package
    assert "zeromismatch package imported from" in out.stderr
    assert not (other / "results" / "reproduced").exists()  # smoke never lands in results/
    assert [snapshot(folder) for folder in watched] == before


def test_full_dry_run_finds_its_profiles_and_writes_in_the_launchers_checkout(tmp_path, elsewhere):
    other = make_checkout(tmp_path / "other")
    before = snapshot(ROOT / "runs" / "full" / "osworld_step_time")
    profile = json.loads((other / "cluster" / "profiles" / "h200-node.json").read_text())
    profile["partition"] = "only-in-the-other-checkout"
    (other / "cluster" / "profiles" / "h200-node.json").write_text(json.dumps(profile))
    argv = [sys.executable, other / LAUNCH, "--scale", "full", "--cluster", "slurm", "--dry-run"]
    out = run(argv, elsewhere, tmp_path)
    assert out.returncode == 0, out.stderr
    scripts = list((other / "runs" / "full" / "osworld_step_time").glob("*.sbatch"))
    assert scripts and all("only-in-the-other-checkout" in p.read_text() for p in scripts)
    assert snapshot(ROOT / "runs" / "full" / "osworld_step_time") == before


@pytest.mark.slow
def test_make_all_and_audit_judge_the_checkout_they_run_in(tmp_path):
    other = make_checkout(tmp_path / "other")  # its claims, and no reproduced runs at all
    report = ROOT / "results" / "REPORT.md"
    before = report.stat().st_mtime_ns if report.exists() else None
    out = run([sys.executable, Path("paper_figures") / "make_all.py", "--quiet"], other, tmp_path)
    assert out.returncode == 0, out.stderr
    verdicts = json.loads((other / "results" / "verdicts.json").read_text())["claims"]
    assert "not-run" in {v["verdict"] for v in verdicts.values()} <= NO_DATA
    assert (other / "results" / "REPORT.md").is_file()
    assert (report.stat().st_mtime_ns if report.exists() else None) == before
    shutil.rmtree(other / "results" / "figures")
    (other / "results" / "verdicts.json").unlink()
    audit = run([ZM, "audit", "--json"], other / "experiments", tmp_path)  # any directory inside the checkout
    assert audit.returncode == 0, audit.stderr
    assert "not-run" in {v["verdict"] for v in json.loads(audit.stdout)} <= NO_DATA
    strict = run([ZM, "audit", "--strict"], other, tmp_path)  # its baseline is the other checkout's (none)
    assert str(other / "results" / "verdicts.json") in strict.stderr
    assert str(ROOT / "results") not in strict.stdout + strict.stderr


def test_outside_any_checkout_without_a_path_is_one_clear_error(tmp_path, elsewhere):
    loose = tmp_path / "loose"  # the files of a checkout, but no git work tree
    for rel in (LAUNCH.parent, Path("paper_figures")):
        shutil.copytree(ROOT / rel, loose / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for argv in (
        [ZM, "audit"],
        [sys.executable, loose / LAUNCH, "--scale", "smoke", "--quiet"],
        [sys.executable, loose / "paper_figures" / "make_all.py", "--quiet"],
    ):
        out = run(argv, elsewhere, tmp_path)
        assert out.returncode == 2, (argv, out.stderr)
        assert "not inside a zeromismatch checkout" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(elsewhere.iterdir()) and not (loose / "runs").exists()
