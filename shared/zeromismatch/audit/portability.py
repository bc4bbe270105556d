"""The report's portability section: the aligned promises re-measured on other machines.

The aligned set is built and verified on the CI CPU; whether its invariances hold elsewhere is a
measurement, not a claim. This section renders what ``zm invariance`` and
``benchmarks/gemm_portability.py`` wrote under ``results/reproduced/portability/``:

- ``invariance_<machine>.json``: one column per run (kernel set x device x thread count), one row
  per check and dtype, ``yes`` when every compared pair was ``torch.equal``;
- ``gemm_rows_<machine>.json`` / ``gemm_tiles_<machine>.json``: per GEMM call and dtype, how many
  weight shapes broke row invariance, and (tiles) at which thread counts;
- ``ops_<device>.json``: ``benchmarks/ops.py --device`` run there, per-op aligned ÷ default.

Nothing here is typed by hand; a file that is absent is simply not shown.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from .registry import AuditInputError, read_json

SUITE = ("reproduced", "portability")


def _machine(data: dict, device_name: str) -> str:
    hardware = (data.get("provenance") or {}).get("hardware") or {}
    cpu = hardware.get("cpu_model", "unknown CPU")
    return device_name if device_name not in ("cpu", "") else cpu


def _invariance(path: Path) -> list[str]:
    data = read_json(path, "invariance report")
    runs = data.get("runs") if isinstance(data, dict) else None
    if not runs:
        raise AuditInputError(f"invariance report {path} has no runs")
    labels = [
        f"{r['kernels']} · {_machine(data, r['device_name'])} · {r['torch_threads']} thr · torch {r['torch']}"
        for r in runs
    ]
    rows: dict[tuple[str, str, str], list[str]] = {}
    for index, run in enumerate(runs):
        for check in run["checks"]:
            cells = rows.setdefault((check["op"], check["prop"], check["dtype"]), ["-"] * len(runs))
            cells[index] = "yes" if check["identical"] else "**NO**"
    commit = (data.get("provenance") or {}).get("git_commit", "unknown")
    lines = [
        f"### Invariance checks (`{'/'.join(SUITE)}/{path.name}`, git {commit})",
        "",
        "| check | dtype | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    lines += [
        f"| {op}/{prop} | {dtype} | " + " | ".join(cells) + " |" for (op, prop, dtype), cells in rows.items()
    ]
    return lines


_KEY = re.compile(
    r"^(?P<dtype>\w+) K=(?P<k>\d+) N=(?P<n>\d+) (?P<call>\S+)(?: T=(?P<tile>\d+))?(?: (?P<rest>.*))?$"
)


def _gemm(path: Path) -> list[str]:
    data = read_json(path, "GEMM portability report")
    machine = _machine(data, data.get("device_name", ""))
    tiles = data.get("mode") == "tiles"
    broken: dict[tuple, set] = defaultdict(set)
    shapes: dict[tuple, set] = defaultdict(set)
    thread_changes: dict[tuple, set] = defaultdict(set)
    for key, value in data.get("findings", {}).items():
        match = _KEY.match(key)
        if match is None:
            raise AuditInputError(f"GEMM portability report {path}: unexpected entry {key!r}")
        group = (match["dtype"], match["call"], match["tile"] or "")
        shape = (match["k"], match["n"])
        rest = match["rest"] or ""
        if rest.startswith("threads_differing"):
            thread_changes[group] |= {str(t) for t in value}
            continue
        shapes[group].add(shape)
        if value["bad_M"] or value["bad_offsets"]:
            broken[group].add((shape, rest.removeprefix("threads=")))
    title = "fixed T-row tiles" if tiles else "row invariance by call"
    commit = (data.get("provenance") or {}).get("git_commit", "unknown")
    lines = [
        f"### GEMM {title}: {machine}, torch {data.get('torch', '?')} "
        f"(`{'/'.join(SUITE)}/{path.name}`, git {commit})",
        "",
    ]
    if tiles:
        lines += [
            "| dtype | call | T | shapes broken | at threads | thread count changes bits |",
            "|---|---|---:|---:|---|---|",
        ]
    else:
        lines += ["| dtype | call | shapes broken |", "|---|---|---:|"]
    for group in sorted(shapes):
        dtype, call, tile = group
        hits = broken.get(group, set())
        if tiles:
            at = sorted({t for _, t in hits}, key=int)
            changes = ", ".join(sorted(thread_changes.get(group, set()), key=int)) or "no"
            lines.append(
                f"| {dtype} | {call} | {tile} | {len({s for s, _ in hits})} of {len(shapes[group])} | "
                f"{', '.join(at) or '-'} | {changes} |"
            )
        else:
            lines.append(f"| {dtype} | {call} | {len(hits)} of {len(shapes[group])} |")
    return lines


def _ops(path: Path) -> list[str]:
    data = read_json(path, "device ops benchmark")
    ratios: dict[str, list[float]] = defaultdict(list)
    for case in data.get("cases", []):
        ratios[case["op"]].append(float(case["throughput_ratio"]))
    commit = (data.get("provenance") or {}).get("git_commit", "unknown")
    on_gpu = str(data.get("device", "cpu")).startswith("cuda")
    hardware = (data.get("provenance") or {}).get("hardware") or {}
    machine = _machine(data, hardware.get("gpu", "cpu") if on_gpu else "cpu")
    tile_rows = ((data.get("provenance") or {}).get("numerics") or {}).get("gemm_tile_rows", 0)
    mode = f", portable mode ({tile_rows}-row GEMM tiles)" if tile_rows else ""
    note = (
        "The CPU-aligned kernels run unchanged on this device; where the checks above say NO, they are "
        "not aligned there, so this is a cost, not a like-for-like comparison."
        if on_gpu
        else f"Measured with {data.get('threads', '?')} thread(s); compare with the main ops table above."
    )
    lines = [
        f"### Per-op throughput on {machine}{mode}, aligned ÷ default "
        f"(`{'/'.join(SUITE)}/{path.name}`, git {commit})",
        "",
        note,
        "",
        "| op | shapes | geomean | worst |",
        "|---|---:|---:|---:|",
    ]
    for op, values in ratios.items():
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        lines.append(f"| {op} | {len(values)} | {geomean:.2f} | {min(values):.2f} |")
    failures = data.get("failures") or []
    if failures:
        lines += ["", f"Cases that could not run there: {', '.join(f['op'] for f in failures)}."]
    return lines


def portability_lines(results_root: Path) -> list[str]:
    """Markdown lines for every portability file present (empty when there are none)."""
    folder = Path(results_root).joinpath(*SUITE)
    lines: list[str] = []
    for pattern, render in (("invariance_*.json", _invariance), ("gemm_*.json", _gemm), ("ops_*.json", _ops)):
        for path in sorted(folder.glob(pattern)):
            lines += ["", *render(path)]
    if lines:
        lines = [
            "",
            "## Portability: the aligned promises measured on other machines",
            "",
            "The aligned set is built and verified on the CI CPU. These runs re-measure its promises "
            "elsewhere (`zm invariance`, `benchmarks/gemm_portability.py`); docs/parity.md discusses them.",
            *lines,
        ]
    return lines
