"""``make reproduce`` verifies: fresh runs are compared with the committed ones bit for bit (weights hash
and every non-timing value, step by step), the table names what differs, and any difference, new or
missing run is a non-zero exit; ``--update`` replaces the committed runs instead; a rerun resumes."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from experiment_helpers import ROOT, make_checkout

from zeromismatch.io import atomic_write_json

FAKE_CONFIGS = """import types


class _Experiment:
    def arms_for(self, scale):
        return [types.SimpleNamespace(name=n, runs=lambda n=n: [(n, None)]) for n in ("a", "b")]


EXPERIMENT = _Experiment()
"""


def load_script(path: Path, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"reproduce_mini_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script(monkeypatch):
    return load_script(ROOT / "scripts" / "reproduce_mini.py", monkeypatch)


def fabricate(run: Path, weights: str = "w0", losses=(0.5, 0.25), seconds: float = 1.0) -> Path:
    records = [
        {"step": i, "loss": loss, "time_rollout_s": seconds * (i + 1)} for i, loss in enumerate(losses)
    ]
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": len(losses), "weights_sha256": weights, "reward_mean_last_fifth": 0.5,
               "time_total_s": seconds,
               "derived_provenance": {"x": {"git_commit": f"c{seconds}"}}}  # fmt: skip
    atomic_write_json(run / "summary.json", summary)
    return run


def test_identical_runs_differ_only_in_timings_and_provenance(tmp_path, script):
    fresh = fabricate(tmp_path / "fresh", seconds=7.5)
    committed = fabricate(tmp_path / "committed", seconds=1.0)
    assert script.compare_run(fresh, committed) == []


def test_one_metric_differing_at_one_step_is_named_with_that_step(tmp_path, script):
    fresh = fabricate(tmp_path / "fresh", losses=(0.5, 0.25, 0.125))
    committed = fabricate(tmp_path / "committed", losses=(0.5, 0.25000000000000006, 0.125))
    assert script.compare_run(fresh, committed) == ["metrics.loss (from step 1)"]


def test_a_weights_hash_difference_comes_first(tmp_path, script):
    fresh = fabricate(tmp_path / "fresh", weights="w1", losses=(0.5, 0.0))
    committed = fabricate(tmp_path / "committed", losses=(0.5, -0.0))  # -0.0 is other bits than 0.0
    assert script.compare_run(fresh, committed) == ["weights_sha256", "metrics.loss (from step 1)"]


def test_missing_steps_and_files_are_differences(tmp_path, script):
    fresh = fabricate(tmp_path / "fresh", losses=(0.5,))
    committed = fabricate(tmp_path / "committed")
    fields = script.compare_run(fresh, committed)
    assert "metrics: 1 steps, committed 2" in fields and "summary.steps" in fields
    (fresh / "metrics.jsonl").unlink()
    assert "metrics.jsonl (only committed)" in script.compare_run(fresh, committed)


def test_rows_for_identical_differs_new_and_missing_and_the_exit_code(tmp_path, script):
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    for name in ("same", "other_weights", "fresh_only"):
        fabricate(fresh / "exp" / "mini" / name, weights="w1" if name == "other_weights" else "w0")
    for name in ("same", "other_weights", "committed_only"):
        fabricate(committed / "exp" / "mini" / name)
    (fresh / "exp" / "mini" / ".partial_run").mkdir()  # a run being written is no run
    rows = script.compare_groups(fresh, committed, [("exp/mini", 1)])
    assert [(r.run, r.status, r.fields) for r in rows] == [
        ("exp/mini/committed_only", "missing", []),
        ("exp/mini/fresh_only", "new", []),
        ("exp/mini/other_weights", "differs", ["weights_sha256"]),
        ("exp/mini/same", "identical", []),
    ]
    table = script.render_table(rows, ["header"])
    assert "differs: weights_sha256" in table and "1 identical, 1 differs, 1 new, 1 missing" in table
    assert script.verdict(rows, []) == 1
    assert script.verdict([r for r in rows if r.status == "identical"], []) == 0
    assert script.verdict([r for r in rows if r.status == "identical"], ["learnability"]) == 1
    for status in ("differs", "new", "missing"):
        assert script.verdict([r for r in rows if r.status in ("identical", status)], []) == 1


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout with one fake experiment (arms a, b) whose committed runs are a, b and c, and its own
    copy of the script, so that the script's checkout is this one; steps are faked, nothing trains."""
    other = tmp_path / "other"
    (other / "experiments" / "fake").mkdir(parents=True)
    (other / "experiments" / "fake" / "configs.py").write_text(FAKE_CONFIGS)
    (other / "experiments" / "fake" / "launch.py").write_text("raise SystemExit('not run in these tests')\n")
    (other / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "reproduce_mini.py", other / "scripts" / "reproduce_mini.py")
    for name in ("a", "b", "c"):
        fabricate(other / "results" / "reproduced" / "fake" / "mini" / name)
    make_checkout(other, ("results/published",))
    module = load_script(other / "scripts" / "reproduce_mini.py", monkeypatch)
    fixed = {"env": module.FIXED_ENV, "torch": "t", "torch_threads": 1, "python": "3", "cpu": "c",
             "git_commit": "g"}  # fmt: skip
    monkeypatch.setattr(module, "settings", lambda root: {**fixed, "checkout": str(root)})
    return other, module


def fake_steps(module, monkeypatch, runs: dict[str, dict]):
    """Each step writes ``runs`` (arm -> fabricate options) into its --out-root; returns the calls."""
    calls = []

    def run_step(step, cwd, log, poll):
        calls.append(step.name)
        out = Path(step.argv[step.argv.index("--out-root") + 1])
        for arm, options in runs.items():
            fabricate(out / "fake" / "mini" / arm, **options)
        return 0

    monkeypatch.setattr(module, "run_step", run_step)
    return calls


ARGS = ["--no-benchmarks", "--no-learnability", "--quiet"]


def test_a_difference_fails_and_the_report_names_it(checkout, monkeypatch, capsys):
    other, module = checkout
    fake_steps(module, monkeypatch, {"a": {"seconds": 9.0}, "b": {"losses": (0.5, 0.3)}, "d": {}})
    out = other / "runs" / "verify"
    assert module.main([*ARGS, "--out", str(out)]) == 1
    table = capsys.readouterr().out
    assert "OMP_NUM_THREADS=1" in table and "CUDA_VISIBLE_DEVICES=''" in table
    report = json.loads((out / "reproduce.json").read_text())
    assert {r["run"]: (r["status"], r["fields"]) for r in report["runs"]} == {
        "fake/mini/a": ("identical", []), "fake/mini/b": ("differs", ["metrics.loss (from step 1)"]),
        "fake/mini/c": ("missing", []), "fake/mini/d": ("new", []),
    }  # fmt: skip
    assert report["settings"]["env"]["OMP_NUM_THREADS"] == "1" and report["updated"] is False
    committed = other / "results" / "reproduced" / "fake" / "mini"
    assert sorted(p.name for p in committed.iterdir()) == ["a", "b", "c"]  # verify leaves results/ alone


def test_identical_passes_and_a_rerun_resumes_without_rerunning(checkout, monkeypatch):
    other, module = checkout
    shutil.rmtree(other / "results" / "reproduced" / "fake" / "mini" / "c")
    calls = fake_steps(module, monkeypatch, {"a": {}, "b": {}})
    out = other / "runs" / "verify"
    assert module.main([*ARGS, "--out", str(out)]) == 0 and calls == ["fake"]
    assert module.main([*ARGS, "--out", str(out)]) == 0 and calls == ["fake"]  # finished there: skipped


def test_update_replaces_the_committed_runs_with_the_fresh_ones(checkout, monkeypatch):
    other, module = checkout
    fake_steps(module, monkeypatch, {"a": {"weights": "w9"}, "b": {}})
    assert module.main([*ARGS, "--out", str(other / "runs" / "verify"), "--update"]) == 0
    committed = other / "results" / "reproduced" / "fake" / "mini"
    assert sorted(p.name for p in committed.iterdir()) == ["a", "b"]
    assert json.loads((committed / "a" / "summary.json").read_text())["weights_sha256"] == "w9"


def test_a_fresh_directory_inside_results_is_refused(checkout, monkeypatch):
    other, module = checkout
    fake_steps(module, monkeypatch, {})
    with pytest.raises(SystemExit) as exit_info:
        module.main([*ARGS, "--out", str(other / "results" / "fresh")])
    assert exit_info.value.code == 2


def test_seeded_arms_are_compared_seed_by_seed(tmp_path, script):
    for root in ("fresh", "committed"):
        fabricate(tmp_path / root / "x" / "mini" / "plain")
        for seed in (0, 1):
            fabricate(tmp_path / root / "x" / "mini" / "fast" / f"seed{seed}", weights=f"w{seed}")
    fabricate(tmp_path / "fresh" / "x" / "mini" / "fast" / "seed1", weights="other")
    rows = script.compare_groups(tmp_path / "fresh", tmp_path / "committed", [("x/mini", 2)])
    assert [(r.run, r.status) for r in rows] == [
        ("x/mini/fast/seed0", "identical"), ("x/mini/fast/seed1", "differs"), ("x/mini/plain", "identical"),
    ]  # fmt: skip


def test_a_difference_across_cpu_kinds_is_named(tmp_path, script):
    machines = (("fresh", "Intel(R) Xeon(R) Processor", "w1"), ("committed", "AMD EPYC", "w0"))
    for root, cpu, weights in machines:
        run = fabricate(tmp_path / root / "x" / "mini" / "a", weights=weights)
        (run / "provenance.json").write_text(json.dumps({"hardware": {"cpu_model": cpu}}))
    (row,) = script.compare_groups(tmp_path / "fresh", tmp_path / "committed", [("x/mini", 2)])
    assert row.status == "differs"
    assert row.text().endswith("[committed on AMD EPYC, rerun on Intel(R) Xeon(R) Processor]")


# ---------------------------------------------------------------------------- --jobs


def _steps(script, tmp_path, names_seconds: dict[str, float], exclusive=("bench",)):
    """Steps with one unit each, committed runs taking the given seconds."""
    out, committed = tmp_path / "fresh", tmp_path / "committed"
    steps = []
    for name, seconds in names_seconds.items():
        unit = out / name / "summary.json"
        if seconds is not None:
            fabricate(committed / name, seconds=seconds)
        steps.append(script.Step(name, ["python", name], [unit], exclusive=name in exclusive))
    return steps, out, committed


def test_training_steps_run_longest_first_and_exclusive_ones_last(script, tmp_path):
    steps, out, committed = _steps(script, tmp_path, {"short": 5.0, "bench": 1.0, "long": 50.0, "new": None})
    shared, exclusive = script.schedule(steps, committed, out)
    assert [s.name for s in shared] == ["new", "long", "short"] and [s.name for s in exclusive] == ["bench"]


def test_two_jobs_run_side_by_side_and_a_timing_runs_alone(script, tmp_path, monkeypatch):
    import threading

    steps, out, committed = _steps(script, tmp_path, {"a": 1.0, "b": 2.0, "bench": 1.0})
    together = threading.Barrier(2, timeout=30)  # breaks (and the test fails) unless a and b overlap
    running, events = set(), []

    def run_step(step, cwd, log, poll):
        running.add(step.name)
        events.append((step.name, frozenset(running)))
        if not step.exclusive:
            together.wait()
        running.discard(step.name)
        return 0

    monkeypatch.setattr(script, "run_step", run_step)
    records, failed = script.run_all(steps, tmp_path, out, True, jobs=2, committed=committed)
    assert failed == [] and [r["step"] for r in records] == ["a", "b", "bench"]
    assert events[-1] == ("bench", frozenset({"bench"}))
    assert (out / script.DONE_DIR / "bench").exists()


def test_one_job_never_overlaps(script, tmp_path, monkeypatch):
    steps, out, committed = _steps(script, tmp_path, {"a": 1.0, "b": 2.0, "c": 3.0})
    running, overlaps = set(), []

    def run_step(step, cwd, log, poll):
        overlaps.append(len(running))
        running.add(step.name)
        time.sleep(0.05)  # long enough that a second job, if one ran, would start meanwhile
        running.discard(step.name)
        return 0 if step.name != "b" else 3

    monkeypatch.setattr(script, "run_step", run_step)
    records, failed = script.run_all(steps, tmp_path, out, True, jobs=1, committed=committed)
    assert overlaps == [0, 0, 0] and failed == ["b"]
    assert not (out / script.DONE_DIR / "b").exists() and (out / script.DONE_DIR / "c").exists()


def test_zero_jobs_is_one_error(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--jobs", "0", "--quiet"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("error:") == 1


def test_the_plan_predicts_the_wall_time_of_longest_first_on_the_jobs(script, tmp_path):
    times = {"a": 30.0, "b": 20.0, "c": 15.0, "bench": 4.0, "new": None}
    steps, out, committed = _steps(script, tmp_path, times)
    # two slots: a (30) | b (20) + c (15) = 35, then the exclusive bench (4); "new" has no time
    assert script.predicted_seconds(steps, committed, out, jobs=2) == (39.0, ["new"])
    assert script.predicted_seconds(steps, committed, out, jobs=1) == (69.0, ["new"])


def test_plan_runs_nothing_and_a_run_records_its_wall_time(checkout, monkeypatch, capsys):
    root, module = checkout
    plan_out = root / "runs" / "plan"
    assert module.main(["--plan", *ARGS, "--out", str(plan_out)]) == 0
    assert "predicted wall time at --jobs" in capsys.readouterr().out and not plan_out.exists()
    fake_steps(module, monkeypatch, {"a": {}, "b": {}})
    out = root / "runs" / "fresh"
    module.main([*ARGS, "--out", str(out)])
    report = json.loads((out / module.REPORT).read_text())
    assert report["wall_s"] >= 0 and report["jobs"] == module.default_jobs()
