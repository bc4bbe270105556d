"""Verify the committed mini runs: rerun every one into a fresh directory and compare them bit for bit.

Every experiment's mini arms (``experiments/<name>/launch.py --scale mini``) and the learnability suite
(``scripts/learnability.py``) rerun into ``--out`` (default ``runs/reproduce-<date>/`` of this script's
checkout), laid out like ``results/reproduced/``. The ratio benchmarks run too, into ``<out>/benchmarks/``;
they are timings and are never compared. Each rerun is then compared with the committed run of the same
name under ``results/reproduced/``: ``weights_sha256`` and every other value of ``summary.json``, and of
``metrics.jsonl`` step by step, bit for bit (the JSON text of each value), except timings (keys starting
``time_``, ``rl.loop.TIMING_PREFIX``) and the provenance a postprocess files in ``derived_provenance``.
A table (run | identical / differs: which fields / new: no committed run / missing: committed, not rerun)
is printed and written with the settings to ``<out>/reproduce.json``.

Exit 0 only when every run is identical and every step succeeded; 1 otherwise; 2 for bad arguments or
no checkout. ``--update`` replaces what was compared under ``results/reproduced/`` (each experiment's
``mini/``, ``learnability/``, the benchmark files written) with the fresh runs instead; when a step
failed nothing is replaced (exit 1).

Everything a bitwise result depends on that a process can choose is fixed here for every child
(``FIXED_ENV``: one OpenMP/MKL thread, so one torch thread; the GEMM mode; CPU only; the hash seed) and
recorded. Resumable: rerun with the same ``--out`` after an interruption and the steps that finished
there are skipped (``<out>/.done/``); inside a step, runs that have a ``summary.json`` are skipped.

``--jobs N`` (default: one per CPU core, at most 2) runs up to N training steps at once, longest first
(by the committed runs' ``time_total_s``). Every child is single-threaded, so running two side by side
changes no bit of either; the benchmarks, which are timings, run afterwards, one at a time, alone. The
overall bar advances by each finished run's committed ``time_total_s``, so its ETA is wall time;
``--plan`` prints the run order and the wall time those times predict, and runs nothing. The wall time
of the whole invocation goes into ``reproduce.json`` (``wall_s``).

    python scripts/reproduce_mini.py [--out DIR] [--update] [--only NAME ...] [--no-benchmarks]
                                     [--no-learnability] [--jobs N] [--plan] [--quiet]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
LEARNABILITY = "learnability"
BENCHMARKS = "benchmarks"
REPORT = "reproduce.json"
DONE_DIR = ".done"
TIMING_PREFIX = "time_"  # zeromismatch.rl.loop.TIMING_PREFIX: values that differ between identical runs
IGNORED_SUMMARY_KEYS = ("derived_provenance",)  # which commit computed a derived value: not a result
#: set in every child: the trainer's backward (unlike the aligned forward) is not thread-count invariant,
#: so a run's weights hash depends on the thread count (torch takes its intra-op threads from OpenMP's);
#: GEMM tile rows 0 is the committed runs' mode (provenance numerics.gemm_tile_rows); the mini runs are
#: CPU runs; a fixed hash seed takes set iteration order out of the question
FIXED_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "ZEROMISMATCH_GEMM_TILE_ROWS": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONHASHSEED": "0",
}
#: test hooks that would crash a run on purpose
UNSET_ENV = ("ZM_CRASH_AFTER_STEP", "ZM_CRASH_DURING_CHECKPOINT")
WARM_START_ENV, WARM_STARTS = "ZEROMISMATCH_WARM_START_DIR", "warm_starts"  # zeromismatch.rl.warm_start
STATUSES = ("identical", "differs", "new", "missing")
OVERALL_BAR = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}"
MAX_DEFAULT_JOBS = 2  # the machines this runs on have 2 cores; more jobs than cores only slows each


@dataclass
class Step:
    """One child process; ``units`` are the files whose existence marks each of its runs finished."""

    name: str
    argv: list[str]
    units: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # set in its environment besides FIXED_ENV
    #: a timing: runs alone, after every other step, so that nothing else shares the CPU with it
    exclusive: bool = False

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name)


SHOWN_FIELDS = 6  # the table names this many differing fields per run; reproduce.json lists all


@dataclass
class Row:
    run: str
    status: str
    fields: list[str] = field(default_factory=list)
    #: where the two runs ran, when not on the same kind of CPU: the trainer's backward and SFT use
    #: stock torch GEMMs, whose reduction order depends on the CPU's instruction set, so such a
    #: difference is expected; on the same CPU kind every run is bitwise reproducible
    machines: str | None = None

    def text(self) -> str:
        if self.status == "differs":
            shown = ", ".join(self.fields[:SHOWN_FIELDS])
            more = len(self.fields) - SHOWN_FIELDS
            text = "differs: " + shown + (f" (+{more} more)" if more > 0 else "")
            return text + (f" [{self.machines}]" if self.machines else "")
        return {"new": "new (no committed run)", "missing": "missing (committed, not rerun)"}.get(
            self.status, self.status
        )


# ---------------------------------------------------------------------------- comparison


def _canon(value: object) -> str:
    # json float text is repr: it round-trips every double exactly, so equal text is equal bits
    # (and -0.0 / 0.0, 1 / 1.0 and NaN are told apart or matched as the files hold them)
    return json.dumps(value, sort_keys=True)


def _compared(record: dict, ignored: tuple[str, ...] = ()) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIX) and k not in ignored}


def _read_summary(run: Path) -> dict | None:
    path = run / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _read_metrics(run: Path) -> list[dict] | None:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_run(fresh: Path, committed: Path) -> list[str]:
    """The fields in which two run directories differ (empty: identical), weights_sha256 first."""
    fields: list[str] = []
    a, b = _read_summary(fresh), _read_summary(committed)
    fresh_steps, committed_steps = _read_metrics(fresh), _read_metrics(committed)
    for name, fresh_value, committed_value in (
        ("summary.json", a, b),
        ("metrics.jsonl", fresh_steps, committed_steps),
    ):
        if (fresh_value is None) != (committed_value is None):
            fields.append(f"{name} ({'only committed' if fresh_value is None else 'only fresh'})")
    if a is not None and b is not None:
        a, b = _compared(a, IGNORED_SUMMARY_KEYS), _compared(b, IGNORED_SUMMARY_KEYS)
        for key in sorted(set(a) | set(b), key=lambda k: (k != "weights_sha256", k)):
            if key not in a or key not in b:
                fields.append(f"summary.{key} (only {'committed' if key not in a else 'fresh'})")
            elif _canon(a[key]) != _canon(b[key]):
                fields.append("weights_sha256" if key == "weights_sha256" else f"summary.{key}")
    if fresh_steps is not None and committed_steps is not None:
        if len(fresh_steps) != len(committed_steps):
            fields.append(f"metrics: {len(fresh_steps)} steps, committed {len(committed_steps)}")
        first: dict[str, int] = {}  # metric -> first step at which it differs
        for step, (x, y) in enumerate(zip(fresh_steps, committed_steps, strict=False)):
            x, y = _compared(x), _compared(y)
            for key in set(x) | set(y):
                if key not in first and (key not in x or key not in y or _canon(x[key]) != _canon(y[key])):
                    first[key] = step
        fields += [f"metrics.{key} (from step {step})" for key, step in sorted(first.items(), key=_by_step)]
    return fields


def _by_step(item: tuple[str, int]) -> tuple[int, str]:
    return item[1], item[0]


def run_dirs(root: Path, group: str, depth: int) -> dict[str, Path]:
    """Run directories at most ``depth`` levels below ``root/group`` (by path relative to ``root``): a
    run is a directory holding summary.json or metrics.jsonl (``<arm>/`` or a seeded arm's
    ``<arm>/seed<k>/``); nothing below a run is searched; dot-names (``.<arm>.partial``) are skipped."""
    found: dict[str, Path] = {}
    level = [root / group] if (root / group).is_dir() else []
    for _ in range(depth):
        children = [c for d in level for c in sorted(d.iterdir()) if c.is_dir() and c.name[0] != "."]
        level = []
        for child in children:
            if (child / "summary.json").is_file() or (child / "metrics.jsonl").is_file():
                found[child.relative_to(root).as_posix()] = child
            else:
                level.append(child)
    return dict(sorted(found.items()))


def _cpu_of(run: Path) -> str | None:
    path = run / "provenance.json"
    try:
        return json.loads(path.read_text()).get("hardware", {}).get("cpu_model") if path.is_file() else None
    except (json.JSONDecodeError, AttributeError):
        return None


def machine_change(fresh: Path, committed: Path) -> str | None:
    """ "committed on <cpu>, rerun on <cpu>" when the provenances name different CPU models, else None."""
    was, now = _cpu_of(committed), _cpu_of(fresh)
    if was is None or now is None or was.strip() == now.strip():
        return None
    return f"committed on {was.strip()}, rerun on {now.strip()}"


def compare_groups(fresh_root: Path, committed_root: Path, groups: list[tuple[str, int]]) -> list[Row]:
    """One row per run in either tree, for each ``(group, depth)``: see :func:`run_dirs`."""
    rows = []
    for group, depth in groups:
        fresh, committed = run_dirs(fresh_root, group, depth), run_dirs(committed_root, group, depth)
        for name in sorted(set(fresh) | set(committed)):
            if name not in committed:
                rows.append(Row(name, "new"))
            elif name not in fresh:
                rows.append(Row(name, "missing"))
            else:
                differing = compare_run(fresh[name], committed[name])
                machines = machine_change(fresh[name], committed[name]) if differing else None
                rows.append(Row(name, "differs" if differing else "identical", differing, machines))
    return rows


def render_table(rows: list[Row], header: list[str]) -> str:
    width = max([len("run"), *(len(r.run) for r in rows)])
    lines = [*header, "", f"{'run':<{width}} | result", f"{'-' * width}-+-{'-' * 30}"]
    lines += [f"{r.run:<{width}} | {r.text()}" for r in rows]
    counts = {status: sum(r.status == status for r in rows) for status in STATUSES}
    lines += ["", ", ".join(f"{n} {status}" for status, n in counts.items())]
    return "\n".join(lines)


def verdict(rows: list[Row], failed_steps: list[str]) -> int:
    """0 when every run is identical and every step ran; 1 on any difference, new or missing run."""
    return 0 if not failed_steps and all(r.status == "identical" for r in rows) else 1


# ---------------------------------------------------------------------------- the steps


def discover(root: Path) -> list[Path]:
    return sorted(p.parent for p in (root / "experiments").glob("*/launch.py"))


def mini_runs(experiment_dir: Path) -> list[str]:
    """The experiment's mini run directories (``<arm>`` or ``<arm>/seed<k>``), from its configs.py
    (imported the way launch.py imports it)."""
    from zeromismatch.experiment.spec import load_experiment_configs

    arms = load_experiment_configs(experiment_dir).EXPERIMENT.arms_for("mini")
    return [name for arm in arms for name, _ in arm.runs()]


def plan(root: Path, out: Path, experiments: list[Path], learnability: bool, benchmarks: bool) -> list[Step]:
    python = sys.executable
    # shared warm starts are built afresh in out/warm_starts/ (once for all the runs that share one),
    # never read from the checkout's cache: they are verified too, through every run that loads them
    fresh = {WARM_START_ENV: str(out / WARM_STARTS)}
    steps = [
        Step(exp.name, [python, str(exp / "launch.py"), "--scale", "mini", "--out-root", str(out), "--quiet"],
             [out / exp.name / "mini" / run / "summary.json" for run in mini_runs(exp)], fresh)
        for exp in experiments
    ]  # fmt: skip
    if learnability:
        from zeromismatch.experiment.learnability import SEEDS, cases

        suite = out / LEARNABILITY
        units = [suite / case.name / f"seed{seed}" / "summary.json" for case in cases() for seed in SEEDS]
        script = str(root / "scripts" / "learnability.py")
        steps.append(Step(LEARNABILITY, [python, script, "--out-root", str(suite), "--quiet"], units, fresh))
    if benchmarks:
        steps += benchmark_steps(root, out / BENCHMARKS)
    return steps


def benchmark_steps(root: Path, bench: Path) -> list[Step]:
    from zeromismatch.audit.benchmark_suite import SUITE

    steps = []
    for b in SUITE:
        argv = [sys.executable, *b.argv(str(bench), str(root)), "--quiet"]
        steps.append(Step(f"benchmark {b.name}", argv, [bench / b.name], exclusive=True))
    return steps


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    env.update(FIXED_ENV)
    return env


_LIVE: set[subprocess.Popen] = set()  # children running now, killed if the parent is interrupted
_LIVE_LOCK = threading.Lock()


def run_step(step: Step, cwd: Path, log: Path, on_poll) -> int:
    """Run one step with its output in ``log``; ``on_poll()`` is called every second while it runs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        env = {**child_env(), **step.env}
        proc = subprocess.Popen(step.argv, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            while True:
                try:
                    return proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    on_poll()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)


def _kill_live() -> None:
    # an interrupt stops the children too; the next run resumes from what finished
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def unit_seconds(unit: Path, committed: Path, out: Path) -> float | None:
    """The committed run's ``time_total_s`` for the fresh run ``unit`` will mark; None if it has none."""
    try:
        return float(json.loads((committed / unit.relative_to(out)).read_text())["time_total_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def expected_seconds(step: Step, committed: Path, out: Path) -> float:
    """What the committed runs of ``step`` took (their ``time_total_s``); unknown counts as longest."""
    times = [unit_seconds(unit, committed, out) for unit in step.units]
    return float("inf") if None in times else sum(times)


def schedule(steps: list[Step], committed: Path, out: Path) -> tuple[list[Step], list[Step]]:
    """(the training steps, longest first; the exclusive steps, in plan order)."""
    shared = [s for s in steps if not s.exclusive]
    shared.sort(key=lambda s: -expected_seconds(s, committed, out))  # stable: ties keep plan order
    return shared, [s for s in steps if s.exclusive]


def predicted_seconds(steps: list[Step], committed: Path, out: Path, jobs: int) -> tuple[float, list[str]]:
    """The wall time the committed runs' times predict for ``steps`` as ``run_all`` runs them (each
    training step, longest first, on the least loaded of ``jobs`` slots; then the exclusive ones), and
    the steps left out of it for want of a committed time (the benchmarks record none)."""
    shared, exclusive = schedule(steps, committed, out)
    known = {s.name: t for s in steps if math.isfinite(t := expected_seconds(s, committed, out))}
    slots = [0.0] * max(1, jobs)
    for step in (s for s in shared if s.name in known):
        slots[slots.index(min(slots))] += known[step.name]
    wall = max(slots) + sum(known.get(s.name, 0.0) for s in exclusive)
    return wall, [s.name for s in steps if s.name not in known]


def run_all(
    steps: list[Step], root: Path, out: Path, quiet: bool, jobs: int = 1, committed: Path | None = None
) -> tuple[list[dict], list[str]]:
    """Run every step not yet done in ``out``, up to ``jobs`` training steps at once, then the exclusive
    ones one by one; returns per-step records (in plan order) and the failed step names."""
    from tqdm import tqdm

    done_dir = out / DONE_DIR
    committed = committed or root / "results" / "reproduced"
    # the overall bar advances by each finished run's committed time, so its ETA is in wall time (a run
    # without one weighs the mean of those with one)
    seconds = {u: unit_seconds(u, committed, out) for s in steps for u in s.units}
    known = [t for t in seconds.values() if t is not None]
    fallback = sum(known) / len(known) if known else 1.0
    weight = {u: fallback if t is None else t for u, t in seconds.items()}

    def units_done(s: Step) -> int:
        return max(1, len(s.units)) if (done_dir / s.slug).exists() else sum(u.is_file() for u in s.units)

    def seconds_done() -> float:
        finished = (u for s in steps for u in s.units if (done_dir / s.slug).exists() or u.is_file())
        return sum(weight[u] for u in finished)

    overall = tqdm(total=sum(weight.values()) or 1.0, initial=seconds_done(), desc="reproduce",
                   disable=quiet, position=0, bar_format=OVERALL_BAR)  # fmt: skip
    runs_total = sum(max(1, len(s.units)) for s in steps)
    bars: dict[str, tqdm] = {}  # one bar per running step: its runs finished of its runs
    slots: dict[str, int] = {}  # its line below the overall bar
    lock = threading.Lock()
    records: dict[str, dict] = {}
    failed: list[str] = []

    def poll() -> None:
        with lock:
            overall.update(seconds_done() - overall.n)
            overall.set_postfix_str(f"{sum(map(units_done, steps))}/{runs_total} runs", refresh=False)
            for name, bar in bars.items():
                bar.update(units_done(by_name[name]) - bar.n)

    def one(step: Step) -> None:
        with lock:
            slots[step.name] = slot = min(set(range(1, jobs + 2)) - set(slots.values()))
            bars[step.name] = tqdm(total=max(1, len(step.units)), initial=units_done(step), unit="run",
                                   desc=step.name, disable=quiet, position=slot, leave=False)  # fmt: skip
        start = time.perf_counter()
        log = out / "logs" / f"{step.slug}.log"
        try:
            rc = run_step(step, root, log, poll)
        finally:
            with lock:
                bars.pop(step.name).close()
                slots.pop(step.name)
        seconds = round(time.perf_counter() - start, 1)
        record = {"step": step.name, "argv": step.argv[1:], "exit": rc, "seconds": seconds}
        with lock:
            records[step.name] = record
            if rc == 0:
                done_dir.mkdir(parents=True, exist_ok=True)
                (done_dir / step.slug).write_text(json.dumps(record) + "\n")
            else:
                failed.append(step.name)
                overall.write(f"reproduce: {step.name} failed (exit {rc}); log {log}:\n{_tail(log)}",
                              file=sys.stderr)  # fmt: skip
        poll()

    by_name = {s.name: s for s in steps}
    todo = []
    for step in steps:
        if (done_dir / step.slug).exists():
            records[step.name] = {"step": step.name, "skipped": "finished in this directory before"}
        else:
            todo.append(step)
    shared, exclusive = schedule(todo, committed, out)
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        pending = {pool.submit(one, step) for step in shared}
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()
        pool.shutdown()
        for step in exclusive:
            one(step)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # nothing queued starts
        _kill_live()
        raise
    overall.close()
    return [records[s.name] for s in steps if s.name in records], failed


def print_plan(steps: list[Step], committed: Path, out: Path, jobs: int) -> None:
    shared, exclusive = schedule(steps, committed, out)
    for step in [*shared, *exclusive]:
        t = expected_seconds(step, committed, out)
        print(f"{'?' if math.isinf(t) else datetime.timedelta(seconds=round(t))!s:>9}  {step.name}"
              f"{'  (alone, after the rest)' if step.exclusive else ''}")  # fmt: skip
    wall, unknown = predicted_seconds(steps, committed, out, jobs)
    left_out = f"; not counted (no committed time): {len(unknown)} steps" if unknown else ""
    print(f"predicted wall time at --jobs {jobs}: {datetime.timedelta(seconds=round(wall))}, from the "
          f"committed runs' time_total_s{left_out}")  # fmt: skip


def default_jobs() -> int:
    return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def settings(root: Path) -> dict:
    """What the reruns were made with: the fixed environment, what torch reports under it, the code."""
    from zeromismatch._provenance import git_state, hardware

    probe = "import json, torch; print(json.dumps([torch.__version__, torch.get_num_threads()]))"
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, timeout=300
        )
        torch_version, threads = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        torch_version, threads = "unknown", None
    commit, _ = git_state(root)
    cpu = hardware().get("cpu_model", "unknown")
    return {"env": FIXED_ENV, "unset": list(UNSET_ENV), "torch": torch_version, "torch_threads": threads,
            "python": sys.version.split()[0], "cpu": cpu, "git_commit": commit,
            "checkout": str(root)}  # fmt: skip


def header_lines(out: Path, committed: Path, config: dict) -> list[str]:
    env = " ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in config["env"].items())
    return [
        f"reproduce: fresh runs in {out}, compared with {committed}",
        f"fixed: {env}; torch {config['torch']} with {config['torch_threads']} thread(s); "
        f"python {config['python']}; cpu {config['cpu']}",
        f"code: {config['checkout']} at {config['git_commit']}",
    ]


def replace_tree(fresh: Path, committed: Path) -> None:
    """``committed`` becomes a copy of ``fresh`` (dot-entries left out), swapped in by renames."""
    committed.parent.mkdir(parents=True, exist_ok=True)
    staged = committed.parent / f".{committed.name}.new"
    aside = committed.parent / f".{committed.name}.old"
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(fresh, staged, ignore=lambda _dir, names: [n for n in names if n.startswith(".")])
    if committed.exists():
        os.replace(committed, aside)
    os.replace(staged, committed)
    shutil.rmtree(aside, ignore_errors=True)


def update(out: Path, committed: Path, groups: list[tuple[str, int]], bench_files: list[Path]) -> None:
    for group, _ in groups:
        if (out / group).is_dir():
            replace_tree(out / group, committed / group)
    for path in bench_files:
        if path.is_file():
            target = committed / BENCHMARKS / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target.with_name(f".{target.name}.new"))
            os.replace(target.with_name(f".{target.name}.new"), target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="fresh directory (default: runs/reproduce-<date>/)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="replace results/reproduced/ with the fresh runs, whatever the comparison says",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"experiment folder names (or {LEARNABILITY!r}) to rerun; no benchmarks then",
    )
    parser.add_argument(
        "--jobs", type=int, default=default_jobs(),
        help=f"training steps run at once (default {default_jobs()}: the cores, at most {MAX_DEFAULT_JOBS})",
    )  # fmt: skip
    parser.add_argument(
        "--plan", action="store_true",
        help="print the steps in run order and the wall time the committed runs predict; run nothing",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar; the table only")
    parser.add_argument("--no-benchmarks", action="store_true", help="skip benchmarks/*.py")
    parser.add_argument("--no-learnability", action="store_true", help="skip scripts/learnability.py")
    args = parser.parse_args(argv)
    from zeromismatch.checkout import NoCheckoutError, inside_results, use_checkout

    try:
        root = use_checkout(HERE)
    except NoCheckoutError as err:
        print(f"reproduce: {err}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be at least 1")
    known = [p.name for p in discover(root)]
    unknown = sorted(set(args.only or ()) - {*known, LEARNABILITY})
    if unknown:
        parser.error(f"unknown --only name(s) {unknown}; known: {', '.join([*known, LEARNABILITY])}")
    only = set(args.only) if args.only is not None else None
    experiments = [p for p in discover(root) if only is None or p.name in only]
    learnability = not args.no_learnability and (only is None or LEARNABILITY in only)
    benchmarks = not args.no_benchmarks and only is None
    date = datetime.date.today().isoformat()
    out = Path(args.out).resolve() if args.out else root / "runs" / f"reproduce-{date}"
    committed = root / "results" / "reproduced"
    if inside_results(out):
        parser.error(f"--out {out} is inside results/: the fresh runs must not mix with what they verify")
    steps = plan(root, out, experiments, learnability, benchmarks)
    if not steps:
        print("reproduce: nothing to run")
        return 0
    groups = [(f"{exp.name}/mini", 2) for exp in experiments] + ([(LEARNABILITY, 2)] if learnability else [])
    if args.plan:
        print_plan(steps, committed, out, args.jobs)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    config = settings(root)
    if not args.quiet:
        print(f"reproduce: {len(steps)} steps into {out}, {args.jobs} at once (rerun with --out {out} to "
              "resume)", flush=True)  # fmt: skip
    started = time.perf_counter()
    records, failed = run_all(steps, root, out, args.quiet, args.jobs, committed)
    wall = round(time.perf_counter() - started, 1)  # this invocation's; a resumed one's excludes the earlier
    rows = compare_groups(out, committed, groups)
    bench_files = [u for s in steps if s.name.startswith("benchmark ") for u in s.units]
    print(render_table(rows, header_lines(out, committed, config)))
    if bench_files:
        print(f"benchmarks (timings, not compared): {sum(p.is_file() for p in bench_files)} files in "
              f"{out / BENCHMARKS}")  # fmt: skip
    updated = bool(args.update and not failed)
    if updated:
        update(out, committed, groups, bench_files)
        print(f"reproduce: --update: {committed} now holds the fresh runs")
    elif args.update:
        print("reproduce: --update: a step failed, nothing replaced", file=sys.stderr)
    from zeromismatch.io import atomic_write_json

    atomic_write_json(out / REPORT, {
        "fresh": str(out), "committed": str(committed), "settings": config, "steps": records,
        "failed_steps": failed, "jobs": args.jobs, "wall_s": wall,
        "runs": [dataclasses.asdict(r) for r in rows],
        "benchmarks": [str(p) for p in bench_files if p.is_file()], "updated": updated,
    })  # fmt: skip
    took = datetime.timedelta(seconds=round(wall))
    print(f"reproduce: {len(records)} steps, wall time {took} at --jobs {args.jobs}")
    if failed:
        print(f"reproduce: failed: {', '.join(failed)}", file=sys.stderr)
    if args.update:
        return 1 if failed else 0
    return verdict(rows, failed)


if __name__ == "__main__":
    sys.exit(main())
