"""The report's benchmark section: every side-by-side speed ratio and the real-vLLM peer, read
from ``results/reproduced/benchmarks/*.json`` and rendered as Markdown tables.

Published claims about speed are judged in the claims table; this section shows the whole
measurement behind them (each op of ``ops.json``, all three systems of ``rollout.json``, the
two-core ceiling of ``async.json``) plus measurements no claim covers (``vllm_peer.json``, a
stock vLLM's logprobs against our trainer). Targets are the issue tracker's, stated beside the
numbers; nothing here is typed by hand, and a file that is absent is simply not shown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from html import escape
from pathlib import Path

from .registry import read_json
from .text import fmt_number

OPS_TARGET = 0.9
ROLLOUT_TARGETS = {"aligned_over_default": 0.95, "engine_over_hf": 3.0}
ASYNC_TARGET = 1.6


def _load(path: Path) -> dict | None:
    return read_json(path, "benchmark file") if path.is_file() else None


def _commit(data: dict) -> str:
    commit = (data.get("provenance") or {}).get("git_commit")
    return f", git {commit[:12]}" if commit else ""


def _ops(data: dict, source: str) -> list[str]:
    ratios: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for case in data.get("cases", []):
        ratios[case["op"]].append((float(case["throughput_ratio"]), case.get("shape", "")))
    lines = [
        f"### Per-op throughput, aligned ÷ default (`{source}`, {data.get('threads', '?')} thread(s))",
        "",
        f"Target: every op at ≥ {OPS_TARGET} (issue 3). Geometric mean over the shapes measured, "
        "and the worst shape.",
        "",
        "| op | shapes | geomean | worst | worst shape | ≥ target |",
        "|---|---:|---:|---:|---|---|",
    ]
    for op, cases in ratios.items():
        geomean = math.exp(sum(math.log(r) for r, _ in cases) / len(cases))
        worst, shape = min(cases)
        lines.append(
            f"| {op} | {len(cases)} | {geomean:.2f} | {worst:.2f} | {shape} | "
            f"{'yes' if geomean >= OPS_TARGET else 'no'} |"
        )
    return lines


def _rollout(data: dict, source: str) -> list[str]:
    tps = data.get("median_tokens_per_s", {})
    lines = [
        f"### Rollout engine throughput (`{source}`{_commit(data)})",
        "",
        "| system | median tokens/s |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {value:.0f} |" for name, value in tps.items()]
    lines += ["", "| ratio | measured | target |", "|---|---:|---:|"]
    if "ratio_aligned_over_default" in data:
        lines.append(
            f"| engine aligned ÷ default | {data['ratio_aligned_over_default']:.2f} | "
            f"{ROLLOUT_TARGETS['aligned_over_default']} |"
        )
    if "ratio_engine_aligned_over_hf" in data:
        lines.append(
            f"| engine aligned ÷ HF `generate` | {data['ratio_engine_aligned_over_hf']:.2f} | "
            f"{ROLLOUT_TARGETS['engine_over_hf']} |"
        )
    return lines


def _async(data: dict, source: str) -> list[str]:
    lines = [
        f"### Async ÷ sync learner throughput (`{source}`{_commit(data)})",
        "",
        f"Measured {data['async_over_sync']:.2f}× at lag {data.get('lag', '?')} (target {ASYNC_TARGET}×; "
        "published 2.40× on 16 GPUs).",
    ]
    if "async_audited_over_sync" in data:
        lines.append(
            "Both arms do the same learner work; with the learner's per-step re-scoring at the rollout's "
            "weight version on in the async arm (as the experiments run): "
            f"{data['async_audited_over_sync']:.2f}×."
        )
    if "ideal_over_sync" in data:
        step = data["sync_step_median_s"]
        lines.append(
            f"Two-core ceiling from the sync arm's median step times ({step['rollout'] * 1e3:.0f} ms "
            f"rollout, {step['learner'] * 1e3:.0f} ms learner): {data['ideal_over_sync']:.2f}×."
        )
    return lines


def _vllm(data: dict, source: str) -> list[str]:
    tps = data["median_tokens_per_s"]
    lines = [
        f"### Peer: a stock vLLM {data.get('vllm_version', '')} on CPU (`{source}`{_commit(data)})",
        "",
        f"Throughput on the same weights and prompts: vLLM {tps['vllm']:.0f} tokens/s, our engine (aligned) "
        f"{tps['engine-aligned']:.0f} tokens/s, ratio {data['ratio_engine_aligned_over_vllm']:.2f}.",
        "",
        "| logprobs compared | tokens | tokens differing | diff max | diff mean | k3 KL | identical |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, stats in data.get("mismatch", {}).items():
        lines.append(
            f"| {name.replace('_', ' ')} | {stats['tokens']} | {stats['tokens_differing']} | "
            f"{fmt_number(stats['diff_max'])} | {fmt_number(stats['diff_mean'])} | "
            f"{fmt_number(stats['k3_kl'])} | {stats['identical']} |"
        )
    return lines


SECTIONS = (("ops.json", _ops), ("rollout.json", _rollout), ("async.json", _async), ("vllm_peer.json", _vllm))


def benchmark_lines(results_root: Path) -> list[str]:
    """Markdown lines for every benchmark file present (empty when there are none)."""
    bench_dir = Path(results_root) / "reproduced" / "benchmarks"
    lines: list[str] = []
    for name, render in SECTIONS:
        data = _load(bench_dir / name)
        if data is None:
            continue
        lines += ["", *render(data, f"reproduced/benchmarks/{name}")]
    if lines:
        lines = ["", "## Benchmarks (ratios measured side by side in one run on this machine)", *lines]
    return lines


def _inline_html(text: str) -> str:
    parts = escape(text).split("`")
    return "".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts))


def lines_to_html(lines: list[str]) -> str:
    """The small Markdown subset :func:`benchmark_lines` emits (headings, paragraphs, pipe tables)
    as HTML, so report.html shows the same tables as REPORT.md."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush_table() -> None:
        if not table:
            return
        header, *rows = table
        out.append('<table class="benchmark"><tr>' + "".join(f"<th>{_inline_html(c)}</th>" for c in header))
        out.extend("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>" for row in rows)
        out.append("</table>")
        table.clear()

    for line in lines:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if not all(set(cell) <= set("-:") for cell in cells):
                table.append(cells)
            continue
        flush_table()
        if line.startswith("### "):
            out.append(f"<h3>{_inline_html(line[4:])}</h3>")
        elif line.startswith("## "):
            out.append(f"<h2>{_inline_html(line[3:])}</h2>")
        elif line:
            out.append(f"<p>{_inline_html(line)}</p>")
    flush_table()
    return "\n".join(out)
