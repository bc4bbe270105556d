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


def _commit(data: dict) -> str:
    return str((data.get("provenance") or {}).get("git_commit", "unknown"))[:12]


def _invariance(paths: list[Path]) -> list[str]:
    """One row per run of every file: which checks broke."""
    lines = [
        "### Invariance checks (`zm invariance`: 9 checks × fp32/bf16 per run)",
        "",
        "| file | kernels | machine | threads | torch | GEMM tiles | identical | broken |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for path in paths:
        data = read_json(path, "invariance report")
        runs = data.get("runs") if isinstance(data, dict) else None
        if not runs:
            raise AuditInputError(f"invariance report {path} has no runs")
        tiles = ((data.get("provenance") or {}).get("numerics") or {}).get("gemm_tile_rows", 0) or "off"
        for run in runs:
            checks = run["checks"]
            broken = [f"{c['op']}/{c['prop']} {c['dtype']}" for c in checks if not c["identical"]]
            machine = _machine(data, run["device_name"])
            held = f"{len(checks) - len(broken)}/{len(checks)}"
            lines.append(
                f"| `{path.name}` ({_commit(data)}) | {run['kernels']} | {machine} | "
                f"{run['torch_threads']} | {run['torch']} | {tiles} | {held} | {', '.join(broken) or '-'} |"
            )
    return lines


_KEY = re.compile(
    r"^(?P<dtype>\w+) K=(?P<k>\d+) N=(?P<n>\d+) (?P<call>\S+)(?: T=(?P<tile>\d+))?(?: (?P<rest>.*))?$"
)


def _gemm_groups(path: Path) -> tuple[dict, dict]:
    """Per (call, tile, dtype): {"shapes": set, "broken": {(shape, threads)}, "thread_changes": set}."""
    data = read_json(path, "GEMM portability report")
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
            group["thread_changes"] |= {str(t) for t in value}
            continue
        shape = (match["k"], match["n"])
        group["shapes"].add(shape)
        if value["bad_M"] or value["bad_offsets"]:
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
        machine = f"{_machine(data, data.get('device_name', ''))}, torch {data.get('torch', '?')}"
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
