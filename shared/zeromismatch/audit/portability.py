"""The report's portability section: the aligned promises re-measured on other machines.

The aligned set is built and verified on the CI CPU; whether its invariances hold elsewhere is a
measurement, not a claim. This section renders what ``zm invariance`` and
``benchmarks/gemm_portability.py`` wrote under ``results/reproduced/portability/``:

- ``invariance_<machine>.json``: one column per run (kernel set x device x thread count), one row
  per check and dtype, ``yes`` when every compared pair was ``torch.equal``;
- ``gemm_rows_<machine>.json`` / ``gemm_tiles_<machine>.json``: per GEMM call and dtype, how many
  weight shapes broke row invariance, and (tiles) at which thread counts;
- ``ops_<device>.json``: ``benchmarks/ops.py --device`` run there, per-op aligned ÷ default.

Nothing here is typed by hand; a file that is absent is simply not shown, and a malformed one is
an :class:`AuditInputError` naming the file and the key path (see :mod:`.inputs`).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from .benchmarks import OPS_TARGET
from .inputs import Node
from .registry import AuditInputError
from .text import short_commit

SUITE = ("reproduced", "portability")


def _hardware(data: Node) -> Node:
    node = data.provenance().get("hardware", {})
    node.obj()
    return node


def _machine(data: Node, device_name: str) -> str:
    cpu = _hardware(data).get("cpu_model", "unknown CPU").scalar()
    return device_name if device_name not in ("cpu", "") else cpu


def _commit(data: Node) -> str:
    return short_commit(data.commit() or "unknown")


def _tile_rows(data: Node) -> int:
    numerics = data.provenance().get("numerics", {})
    return int(numerics.get("gemm_tile_rows", 0).number())


def _invariance(paths: list[Path]) -> list[str]:
    """One row per run of every file: which checks broke."""
    lines = [
        "### Invariance checks (`zm invariance`: 9 checks × fp32/bf16 per run)",
        "",
        "| file | kernels | machine | threads | torch | GEMM tiles | identical | broken |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for path in paths:
        data = Node.load(path, "invariance report")
        runs = data.get("runs", []).list()
        if not runs:
            raise AuditInputError(f"invariance report {path} has no runs")
        tiles = _tile_rows(data) or "off"
        for run in runs:
            checks = run["checks"].list()
            broken = [
                f"{c['op'].text()}/{c['prop'].text()} {c['dtype'].text()}"
                for c in checks
                if not c["identical"].boolean()
            ]
            machine = _machine(data, run["device_name"].scalar())
            held = f"{len(checks) - len(broken)}/{len(checks)}"
            lines.append(
                f"| `{path.name}` ({_commit(data)}) | {run['kernels'].scalar()} | {machine} | "
                f"{run['torch_threads'].scalar()} | {run['torch'].scalar()} | {tiles} | {held} | "
                f"{', '.join(broken) or '-'} |"
            )
    return lines


_KEY = re.compile(
    r"^(?P<dtype>\w+) K=(?P<k>\d+) N=(?P<n>\d+) (?P<call>\S+)(?: T=(?P<tile>\d+))?(?: (?P<rest>.*))?$"
)


def _gemm_groups(path: Path) -> tuple[dict, dict]:
    """Per (call, tile, dtype): {"shapes": set, "broken": {(shape, threads)}, "thread_changes": set}."""
    data = Node.load(path, "GEMM portability report")
    groups: dict[tuple, dict] = defaultdict(
        lambda: {"shapes": set(), "broken": set(), "thread_changes": set()}
    )
    for key, value in data.get("findings", {}).items():
        match = _KEY.match(key)
        if match is None:
            raise AuditInputError(f"GEMM portability report {path}: unexpected entry {key!r}")
        group = groups[(match["call"], match["tile"] or "", match["dtype"])]
        rest = match["rest"] or ""
        if rest.startswith("threads_differing"):
            group["thread_changes"] |= {str(int(t.number())) for t in value.list()}
            continue
        shape = (match["k"], match["n"])
        group["shapes"].add(shape)
        if value["bad_M"].list() or value["bad_offsets"].list():
            group["broken"].add((shape, rest.removeprefix("threads=")))
    return data, groups


def _broken_cell(group: dict | None, tiles: bool) -> str:
    if group is None:
        return "-"
    cell = f"{len({s for s, _ in group['broken']})}/{len(group['shapes'])}"
    if tiles and group["broken"]:
        cell += f" (at {', '.join(sorted({t for _, t in group['broken']}, key=int))} threads)"
    if tiles and group["thread_changes"]:
        cell += f"; bits change at {', '.join(sorted(group['thread_changes'], key=int))} threads"
    return cell


def _gemm(paths: list[Path], tiles: bool) -> list[str]:
    title = (
        "### GEMM calls of a fixed row count T (`benchmarks/gemm_portability.py --mode tiles`)"
        if tiles
        else "### GEMM row invariance by call (`benchmarks/gemm_portability.py --mode rows`)"
    )
    lines = [
        title,
        "",
        "Weight shapes (of 5) on which some row count or row offset changed a row's bits"
        + (", at 1/4/16 threads on a CPU." if tiles else "."),
        "",
        "| machine | file | call | " + ("T | " if tiles else "") + "fp32 | bf16 |",
        "|---|---|---|" + ("---:|" if tiles else "") + "---|---|",
    ]
    for path in paths:
        data, groups = _gemm_groups(path)
        device = data.get("device_name", "").scalar()
        machine = f"{_machine(data, device)}, torch {data.get('torch', '?').scalar()}"
        for call, tile in sorted({(c, t) for c, t, _ in groups}, key=lambda ct: (ct[0], int(ct[1] or 0))):
            cells = [_broken_cell(groups.get((call, tile, dtype)), tiles) for dtype in ("fp32", "bf16")]
            lines.append(
                f"| {machine} | `{path.name}` ({_commit(data)}) | {call} | "
                + (f"{tile} | " if tiles else "")
                + " | ".join(cells)
                + " |"
            )
    return lines


def _ops(path: Path) -> list[str]:
    data = Node.load(path, "device ops benchmark")
    ratios: dict[str, list[float]] = defaultdict(list)
    for case in data.get("cases", []).list():
        ratios[case["op"].text()].append(case["throughput_ratio"].positive())
    on_gpu = data.get("device", "cpu").scalar().startswith("cuda")
    machine = _machine(data, _hardware(data).get("gpu", "cpu").scalar() if on_gpu else "cpu")
    tile_rows = _tile_rows(data)
    mode = f", portable mode ({tile_rows}-row GEMM tiles)" if tile_rows else ""
    note = (
        "The CPU-aligned kernels run unchanged on this device; where the checks above say NO, they are "
        "not aligned there, so this is a cost, not a like-for-like comparison."
        if on_gpu
        else f"Measured with {data.get('threads', '?').scalar()} thread(s); compare with the main ops "
        "table above."
    )
    lines = [
        f"### Per-op throughput on {machine}{mode}, aligned ÷ default "
        f"(`{'/'.join(SUITE)}/{path.name}`, git {_commit(data)})",
        "",
        note,
        "",
        f"| op | shapes | geomean | worst | shapes below {OPS_TARGET} |",
        "|---|---:|---:|---:|---:|",
    ]
    for op, values in ratios.items():
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        below = sum(1 for v in values if v < OPS_TARGET)
        lines.append(f"| {op} | {len(values)} | {geomean:.2f} | {min(values):.2f} | {below} |")
    failures = data.get("failures", []).list()
    if failures:
        lines += ["", f"Cases that could not run there: {', '.join(f['op'].scalar() for f in failures)}."]
    return lines


def portability_lines(results_root: Path) -> list[str]:
    """Markdown lines for every portability file present (empty when there are none)."""
    folder = Path(results_root).joinpath(*SUITE)
    lines: list[str] = []
    invariance = sorted(folder.glob("invariance_*.json"))
    if invariance:
        lines += ["", *_invariance(invariance)]
    for prefix, tiles in (("gemm_rows_", False), ("gemm_tiles_", True)):
        paths = sorted(folder.glob(f"{prefix}*.json"))
        if paths:
            lines += ["", *_gemm(paths, tiles)]
    for path in sorted(folder.glob("ops_*.json")):
        lines += ["", *_ops(path)]
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
