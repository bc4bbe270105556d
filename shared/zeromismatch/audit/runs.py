"""Reproduced data: run directories, benchmark files, and the operands claims read from them.

Layout (written by experiments and benchmarks, only read here). A *data dir* holds
``metrics.jsonl`` (one JSON object per step), ``summary.json`` (a dict of named measured values)
and ``provenance.json``. Under ``results/reproduced/<experiment>/<scale>/`` the audit considers,
as *candidates* for judging a claim:

1. each ``<run>/`` (newest name first): its own files, and any ``<run>/<arm>/`` data dirs;
2. the scale directory itself, whose data-dir children are taken as arms (for experiments that
   write one run per arm, e.g. ``mini/aligned/`` and ``mini/default/``, as zeromismatch.rl does).

A *seeded arm* is a directory with no data files of its own whose data-dir children are all named
``seed<k>`` (``mini/fast/seed0/``, ``mini/fast/seed1/``, ...): one arm run on several seeds. It is
an arm of the scale group (or, as ``<run>/<arm>/seed<k>/``, of its run), never a candidate of its
own, and an operand reads it only through ``over_seeds`` (:mod:`.seeds`): the seeds of one arm
are samples of one quantity, and a claim must say how to combine them.

Directories whose names start with ``.`` are skipped: ``.<arm>.partial/`` is a run still being
written, which judges nothing until it is renamed into place.

Claims are judged at scales ``full`` then ``mini`` (``JUDGED_SCALES``); ``smoke`` and
``full-smoke`` runs (the full tier's code path at smoke size: Ray, vLLM, Megatron-core) are plumbing
checks and judge nothing unless a claim's test lists their scale.

An operand for arm A is read from a candidate's own files as key ``A.<key>`` (or, in metrics
records with ``"arm": "A"``, key ``<key>``), else from its arm data dir ``A/`` as ``<key>``.
Benchmarks are ``results/reproduced/benchmarks/<name>.json`` (a dict; provenance inside it or in
``<name>.provenance.json``). Missing data raises :class:`MissingData` (the claim is then not-run);
malformed data raises :class:`AuditInputError` naming the file, never a guess.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .registry import AuditInputError, read_json

SCALES = ("full", "mini", "full-smoke", "smoke")
# Smoke runs check plumbing in seconds; a claim is judged on them only if its test lists "smoke".
JUDGED_SCALES = ("full", "mini")
BENCHMARKS_DIR = "benchmarks"
DEFAULT_WINDOW = 0.1
_DATA_FILES = ("summary.json", "metrics.jsonl")
SEED_DIR = re.compile(r"^seed([0-9]+)$")


class MissingData(LookupError):
    """The data a claim needs is not there (yet)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _has_data(path: Path) -> bool:
    return any((path / name).exists() for name in _DATA_FILES)


@dataclass
class DataDir:
    """One directory of run files; each file is parsed on first use."""

    results_root: Path
    path: Path
    _summary: dict | None = None
    _records: list[dict] | None = None
    _provenance: dict | None = None

    @property
    def rel(self) -> str:
        return self.path.relative_to(self.results_root).as_posix() + "/"

    @property
    def summary(self) -> dict:
        if self._summary is None:
            path = self.path / "summary.json"
            data = read_json(path, "summary.json") if path.exists() else {}
            if not isinstance(data, dict):
                raise AuditInputError(f"malformed summary.json {path}: expected a JSON object")
            self._summary = data
        return self._summary

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            self._records = load_metrics(self.path / "metrics.jsonl")
        return self._records

    @property
    def provenance(self) -> dict:
        if self._provenance is None:
            path = self.path / "provenance.json"
            data = read_json(path, "provenance.json") if path.exists() else {}
            if not isinstance(data, dict):
                raise AuditInputError(f"malformed provenance.json {path}: expected a JSON object")
            self._provenance = data
        return self._provenance

    def check(self) -> None:
        """Parse every file now, so a malformed one fails loudly even if no claim reads it."""
        _ = self.summary, self.records, self.provenance


@dataclass
class Run:
    """A candidate for judging claims: own files and/or arm data dirs."""

    results_root: Path
    path: Path
    experiment: str
    scale: str
    own: DataDir | None
    arms: dict[str, DataDir] = field(default_factory=dict)
    seeds: dict[str, list[tuple[int, DataDir]]] = field(default_factory=dict)  # seeded arms, seed order

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def rel(self) -> str:
        return self.path.relative_to(self.results_root).as_posix() + "/"

    @property
    def is_scale_group(self) -> bool:
        return self.path.parent.name == self.experiment

    def data_dirs(self) -> list[DataDir]:
        seeded = [data for seeds in self.seeds.values() for _, data in seeds]
        return ([self.own] if self.own else []) + list(self.arms.values()) + seeded


def load_metrics(path: Path) -> list[dict]:
    """Read ``metrics.jsonl``: one JSON object per non-empty line; NaN/Infinity allowed."""
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise AuditInputError(f"cannot read metrics.jsonl {path}: {err}") from err
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise AuditInputError(f"malformed metrics.jsonl {path}: line {lineno}: {err.msg}") from err
        if not isinstance(record, dict):
            raise AuditInputError(f"malformed metrics.jsonl {path}: line {lineno} is not a JSON object")
        records.append(record)
    return records


def _subdirs(path: Path) -> list[Path]:
    """Child directories by name, without hidden ones: ``.<name>.partial`` is a run still being written."""
    children = (p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    return sorted(children, key=lambda p: p.name)


def seeded_arm(results_root: Path, path: Path) -> list[tuple[int, DataDir]] | None:
    """``path``'s ``(seed, data dir)`` pairs in seed order when it is a seeded arm, else None.

    A directory that mixes seed dirs with its own data files or with other data dirs is neither an
    arm nor a run of arms: an AuditInputError, since either reading would be a guess.
    """
    children = [sub for sub in _subdirs(path) if _has_data(sub)]
    seeded = [sub for sub in children if SEED_DIR.match(sub.name)]
    if not seeded:
        return None
    names = ", ".join(sub.name for sub in seeded)
    if _has_data(path):
        raise AuditInputError(
            f"malformed run directory {path}: holds data files of its own and seed dirs ({names}); "
            f"a seeded arm keeps its data in seed<k>/ only"
        )
    others = [sub.name for sub in children if sub not in seeded]
    if others:
        raise AuditInputError(
            f"malformed seeded arm {path}: holds seed dirs ({names}) and other data dirs "
            f"({', '.join(others)})"
        )
    by_seed: dict[int, DataDir] = {}
    for sub in seeded:
        seed = int(SEED_DIR.match(sub.name).group(1))
        if seed in by_seed:
            raise AuditInputError(
                f"malformed seeded arm {path}: {by_seed[seed].path.name}/ and {sub.name}/ are both "
                f"seed {seed}"
            )
        by_seed[seed] = DataDir(results_root, sub)
    return sorted(by_seed.items())


def all_runs(results_root: Path, experiment: str) -> list[Run]:
    """Every candidate of an experiment at every scale: runs (name descending), then the scale group.

    Data dirs are shared between a run and the scale group, so each file is parsed once. A seeded
    arm directly under the scale directory is an arm of the scale group only.
    """
    base = results_root / "reproduced" / experiment
    if not base.is_dir():
        return []
    runs = []
    for scale_dir in _subdirs(base):
        group_arms: dict[str, DataDir] = {}
        group_seeds: dict[str, list[tuple[int, DataDir]]] = {}
        for run_dir in reversed(_subdirs(scale_dir)):
            seeds = seeded_arm(results_root, run_dir)
            if seeds is not None:
                group_seeds[run_dir.name] = seeds
                continue
            own = DataDir(results_root, run_dir) if _has_data(run_dir) else None
            arms: dict[str, DataDir] = {}
            run_seeds: dict[str, list[tuple[int, DataDir]]] = {}
            for sub in _subdirs(run_dir):
                if _has_data(sub):
                    arms[sub.name] = DataDir(results_root, sub)
                elif (seeds := seeded_arm(results_root, sub)) is not None:
                    run_seeds[sub.name] = seeds
            if own or arms or run_seeds:
                runs.append(Run(results_root, run_dir, experiment, scale_dir.name, own, arms, run_seeds))
            if own:
                group_arms[run_dir.name] = own
        if group_arms or group_seeds:
            arms = dict(sorted(group_arms.items()))
            seeded = dict(sorted(group_seeds.items()))
            runs.append(Run(results_root, scale_dir, experiment, scale_dir.name, None, arms, seeded))
    return runs


def order_runs(runs: list[Run], scales: tuple[str, ...] | list[str] = SCALES) -> list[Run]:
    """Candidates at the given scales, by ``scales`` order; within a scale, the order of all_runs.

    Run names sort newest first (name order, not mtime, so every clone chooses alike); the scale
    group comes last.
    """
    rank = {scale: index for index, scale in enumerate(scales)}
    return sorted((run for run in runs if run.scale in rank), key=lambda run: rank[run.scale])


def discover_runs(results_root: Path, experiment: str, scales=SCALES) -> list[Run]:
    return order_runs(all_runs(results_root, experiment), scales)


@dataclass
class Benchmark:
    results_root: Path
    name: str
    path: Path
    data: dict
    provenance: dict
    provenance_rel: str | None = None  # where the provenance came from, relative to the results root

    @property
    def rel(self) -> str:
        return self.path.relative_to(self.results_root).as_posix()


def load_benchmark(results_root: Path, name: str) -> Benchmark | None:
    path = results_root / "reproduced" / BENCHMARKS_DIR / f"{name}.json"
    if not path.exists():
        return None
    data = read_json(path, "benchmark file")
    if not isinstance(data, dict):
        raise AuditInputError(f"malformed benchmark file {path}: expected a JSON object")
    provenance = data.get("provenance")
    where = path.relative_to(results_root).as_posix() if isinstance(provenance, dict) else None
    side = path.with_name(f"{name}.provenance.json")
    if not isinstance(provenance, dict) and side.exists():
        provenance = read_json(side, "provenance.json")
        where = side.relative_to(results_root).as_posix()
    if not isinstance(provenance, dict):
        provenance, where = {}, None
    return Benchmark(results_root, name, path, data, provenance, where)


def lookup_key(data: dict, key: str, where: str) -> float:
    """A number from a dict by literal key, else by dotted path into nested dicts."""
    if key in data:
        value = data[key]
    else:
        value = data
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise MissingData(f"{where} has no key {key!r}")
            value = value[part]
    if value is None:
        raise MissingData(f"{where} has {key!r} = null")
    if not _is_number(value):
        raise AuditInputError(f"malformed {where}: key {key!r} should be a number, got {value!r}")
    return float(value)


def _record_value(record: dict, keys: list[str], path: Path, index: int):
    """Sum of ``keys`` in one record (one key: its value); None if any is absent or null."""
    total = 0.0
    for key in keys:
        value = record.get(key)
        if value is None:
            return None
        if not _is_number(value):
            raise AuditInputError(
                f"malformed metrics.jsonl {path}: record {index + 1} key {key!r} should be a number, "
                f"got {value!r}"
            )
        total += float(value)
    return total


def _per_record(record: dict, names: list[str], arm: str | None, prefixed: bool, path: Path, index: int):
    if prefixed and arm:
        value = _record_value(record, [f"{arm}.{n}" for n in names], path, index)
        if value is None and record.get("arm") == arm:
            value = _record_value(record, names, path, index)
        return value
    return _record_value(record, names, path, index)


def metric_series(data: DataDir, metric: str, arm: str | None, prefixed: bool) -> list[tuple[int, float]]:
    """``(step, value)`` pairs in file order. ``metric`` may be ``a+b`` (per-record sum) and may end in
    ``/c`` (that per-record value divided by key ``c``, e.g. a step time per token); a record whose
    divisor is 0 has no value.

    prefixed=True: read arm A as keys ``A.<m>`` or records with ``"arm": "A"``; False: plain keys.
    """
    numerator, _, divisor = metric.partition("/")
    names = numerator.split("+")
    path = data.path / "metrics.jsonl"
    series = []
    for index, record in enumerate(data.records):
        value = _per_record(record, names, arm, prefixed, path, index)
        if value is not None and divisor:
            by = _per_record(record, [divisor], arm, prefixed, path, index)
            value = value / by if by else None
        if value is None:
            continue
        step = record.get("step", index)
        series.append((int(step) if _is_number(step) else index, value))
    return series


@dataclass
class Resolved:
    """A measured number (or, for agg 'all', every step's number) and where it was read."""

    label: str
    value: float
    values: list[float] | None = None  # only for agg 'all'
    steps: int | None = None  # how many step records fed it (metric operands)
    missing: int = 0  # agg 'all': steps whose value is null or absent (each one fails "every step")
    samples: list[float] | None = None  # agg mean/head_mean/tail_mean: the per-step values averaged
    nonfinite: int = 0  # values read that void the aggregate (NaN; inf except for max/min/median)
    aggregated: int = 0  # how many step values the aggregate read
    commits: set[str] = field(default_factory=set)  # commits of a derived value (add_to_summary)
    source: str = ""  # e.g. "reproduced/x/mini/r/metrics.jsonl default.k3_kl tail_mean of 12 of 120 steps"
    data: DataDir | None = None
    # over_seeds: each seed's own value in seed order (``samples`` then holds these values), and
    # the seed data dirs read (``data`` is then None: no one dir holds the value)
    per_seed: list[tuple[int, float]] | None = None
    seed_data: list[DataDir] = field(default_factory=list)

    @property
    def data_dirs(self) -> list[DataDir]:
        """Every data dir the value was read from."""
        return list(self.seed_data) if self.seed_data else [self.data] if self.data is not None else []


def operand_label(operand: dict) -> str:
    if "label" in operand:
        return operand["label"]
    arm = f"{operand['arm']}." if operand.get("arm") else ""
    if "summary" in operand:
        text = f"summary {arm}{operand['summary']}"
    elif "benchmark_key" in operand:
        text = f"benchmark {operand['benchmark_key']}"
    else:
        text = f"{arm}{operand['metric']} ({operand['agg']})"
    if "abs_dev_from" in operand:
        text = f"|{text} - {operand['abs_dev_from']:g}|"
    if "over_seeds" in operand:
        text = f"{text}, {operand['over_seeds']} over seeds"
    return text


def window_width(operand: dict, steps: int) -> int:
    """How many steps a head/tail mean averages: ``window_steps`` when given (a rolling mean of that
    many steps, read at the run's start or end), else the fraction ``window`` of the run's steps."""
    if "window_steps" in operand:
        return min(steps, int(operand["window_steps"]))
    return max(1, math.ceil(operand.get("window", DEFAULT_WINDOW) * steps))


def _aggregate(values: list[float], agg: str, width: int) -> float:
    array = np.asarray(values, dtype=np.float64)
    if agg == "count":
        return float(array.size)
    if agg == "count_nonfinite":
        return float(np.count_nonzero(~np.isfinite(array)))
    if agg == "first":
        return float(array[0])
    if agg == "last":
        return float(array[-1])
    if agg in ("head_mean", "tail_mean"):
        return float(np.mean(array[:width] if agg == "head_mean" else array[-width:]))
    reducer = {"min": np.min, "max": np.max, "mean": np.mean, "median": np.median}[agg]
    return float(reducer(array))


def _read_by(values: list[float], agg: str, width: int) -> list[float]:
    """The step values an aggregate's result depends on."""
    if agg == "first":
        return values[:1]
    if agg == "last":
        return values[-1:]
    return _averaged(values, agg, width) or list(values)


def _averaged(values: list[float], agg: str, width: int) -> list[float] | None:
    """The per-step values a mean aggregate averages (for a standard error), else None."""
    if agg == "mean":
        return list(values)
    if agg in ("head_mean", "tail_mean"):
        return list(values[:width] if agg == "head_mean" else values[-width:])
    return None


def _expected_steps(data: DataDir, arm: str | None, prefixed: bool) -> int:
    """How many steps an arm should have recorded: its step records, or the summary's ``steps`` if more.

    A record belongs to arm A when read unprefixed (A's own data dir), or when it carries
    ``"arm": "A"`` or an ``A.<key>``. A step whose value is null or absent is a step not shown to be
    zero, so "exactly 0 at every step" counts it as a failure rather than skipping it.
    """
    if prefixed and arm:
        records = [r for r in data.records if r.get("arm") == arm or any(k.startswith(f"{arm}.") for k in r)]
        keys = (f"{arm}.steps", "steps")
    else:
        records, keys = data.records, ("steps",)
    stated = next((data.summary[k] for k in keys if _is_number(data.summary.get(k))), 0)
    return max(len(records), int(stated))


def _places(run: Run, arm: str | None) -> list[tuple[DataDir, bool]]:
    """Where an operand may be read: (data dir, keys prefixed by arm?) in order of preference."""
    places = [(run.own, True)] if run.own else []
    if arm and arm in run.arms:
        places.append((run.arms[arm], False))
    return places


def _resolve_summary(operand: dict, places: list[tuple[DataDir, bool]], label: str, where: str) -> Resolved:
    arm, key = operand.get("arm"), operand["summary"]
    for data, prefixed in places:
        name = f"{arm}.{key}" if arm and prefixed else key
        try:
            value = lookup_key(data.summary, name, f"summary.json {data.path / 'summary.json'}")
        except MissingData:
            continue
        resolved = Resolved(label, value, source=f"{data.rel}summary.json {name}", data=data)
        derived = data.summary.get("derived_provenance") if isinstance(data.summary, dict) else None
        record = derived.get(name) if isinstance(derived, dict) else None
        if isinstance(record, dict):
            # a postprocess wrote this value: the commits that computed it and its inputs count too
            inputs = record.get("inputs") if isinstance(record.get("inputs"), dict) else {}
            resolved.commits = {str(c) for c in (record.get("git_commit"), *inputs.values()) if c}
        return resolved
    raise MissingData(f"{where} records no summary key {(arm + '.') if arm else ''}{key}")


def _resolve_metric(operand: dict, places: list[tuple[DataDir, bool]], label: str, where: str) -> Resolved:
    metric, arm, agg = operand["metric"], operand.get("arm"), operand["agg"]
    for data, prefixed in places:
        series = metric_series(data, metric, arm, prefixed)
        if not series:
            continue
        values = [value for _, value in series]
        name = f"{arm}.{metric}" if arm and prefixed else metric
        width = window_width(operand, len(values))
        detail = f"{agg} over {len(values)} steps"
        if agg in ("head_mean", "tail_mean"):
            detail = f"{agg} of {width} of {len(values)} steps"
        if agg == "all":
            value = float(np.max(np.abs(values)))
            missing = _expected_steps(data, arm, prefixed) - len(values)
            resolved = Resolved(label, value, values=values, steps=len(values), data=data)
            resolved.missing = max(0, missing)
        else:
            resolved = Resolved(label, _aggregate(values, agg, width), steps=len(values), data=data)
            resolved.samples = _averaged(values, agg, width)
            if agg not in ("count", "count_nonfinite"):
                # An extreme over an inf step is honestly inf (an infinite mismatch is the largest),
                # and a median is robust to one; a mean or a single step over one is not a level of
                # the curve. NaN (nothing measured at that step) decides nothing under any aggregate.
                read = _read_by(values, agg, width)
                unusable = math.isnan if agg in ("max", "min", "median") else (lambda v: not math.isfinite(v))
                resolved.aggregated = len(read)
                resolved.nonfinite = sum(1 for v in read if unusable(v))
        resolved.source = f"{data.rel}metrics.jsonl {name} {detail}"
        return resolved
    raise MissingData(f"{where} has no metrics series {(arm + '.') if arm else ''}{metric}")


def _deviation(operand: dict, resolved: Resolved) -> Resolved:
    if "abs_dev_from" in operand:
        resolved.value = abs(resolved.value - operand["abs_dev_from"])
    return resolved


def resolve_in(operand: dict, places: list[tuple[DataDir, bool]], label: str, where: str) -> Resolved:
    """A run operand's value from the first of ``places`` that records it (``where`` names them in
    MissingData); ``abs_dev_from`` applied."""
    if "summary" in operand:
        return _deviation(operand, _resolve_summary(operand, places, label, where))
    return _deviation(operand, _resolve_metric(operand, places, label, where))


def resolve_operand(operand: dict, run: Run | None = None, benchmark: Benchmark | None = None) -> Resolved:
    """Measure one operand; raises MissingData when the run or benchmark does not record it."""
    label = operand_label(operand)
    if "benchmark_key" in operand:
        if benchmark is None:
            raise MissingData("no benchmark file")
        value = lookup_key(benchmark.data, operand["benchmark_key"], f"benchmark file {benchmark.path}")
        resolved = Resolved(label, value, source=f"{benchmark.rel} {operand['benchmark_key']}")
        return _deviation(operand, resolved)
    if run is None:
        raise MissingData("no run")
    if "over_seeds" in operand or operand.get("arm") in run.seeds:
        from .seeds import resolve_over_seeds  # seeds.py builds on this module

        return resolve_over_seeds(operand, run, label)
    return resolve_in(operand, _places(run, operand.get("arm")), label, run.rel)
