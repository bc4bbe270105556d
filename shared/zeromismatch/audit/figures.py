"""Every report figure, drawn from ``results/`` only (headless: matplotlib Agg + seaborn).

- ``<experiment>__published_vs_reproduced.png``: one row per claim; left the published numbers
  (labelled with the published scale), right the measured numbers the verdict used (labelled with
  the run's scale and verdict), or a "not run" / "out of reach" note. The two sides keep separate
  axes: published and stand-in metrics are often in different units (% vs fraction, hours vs s).
- ``curves__<experiment>__<scale>.png``: training curves from the metrics.jsonl of every run at
  that scale, one panel per metric family present (diff and k3 KL, reward, IS-weight
  peak/median, grad norm, ...), one colour per run/arm.
- ``throughput_ratios.png``: published speed ratios beside measured ones.

Style: one seaborn theme and fixed colours: grey = published, one colour per reproduced scale.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections import Counter, deque
from pathlib import Path

from ..io import atomic_write_bytes
from .registry import Registry
from .runs import DataDir, Run, all_runs
from .text import fmt_number, fmt_value, scale_text
from .verdicts import Verdict

FIGURES_DIR = "figures"
PUBLISHED_COLOR = "#6b6b6b"
SCALE_COLORS = {
    "full": "#0072b2",
    "mini": "#009e73",
    "smoke": "#cc79a7",
    "full-smoke": "#d55e00",
    "benchmark": "#e69f00",
}
VERDICT_COLORS = {
    "reproduced-exact": "#1a7f37",
    "reproduced-direction": "#2da44e",
    "not-reproduced": "#cf222e",
    "not-run": "#6e7781",
    "out-of-reach": "#8250df",
}

# (panel title, metric base names) -- the families drawn from metrics.jsonl, in panel order.
# Names are those zeromismatch.rl.loop writes to metrics.jsonl (plus a few synonyms).
CURVE_FAMILIES = (
    ("logprob diff, same weights (max/mean/std)", ("diff_max", "diff_mean", "diff_std")),
    ("k3 KL", ("k3_kl",)),
    ("reward", ("reward_mean", "reward")),
    ("IS weight peak / median", ("peak_over_median", "is_peak_over_median")),
    ("grad norm (pre-clip)", ("grad_norm_preclip", "grad_norm")),
    ("lag decomposition |max|", ("gap_kernel_abs_max", "gap_weight_lag_abs_max")),
    ("eval pass@1", ("eval_pass_at_1", "pass_at_1")),
    ("solved, training tasks (5-step rolling mean)", ("solved_rate",)),
    ("policy lag", ("lag_mean", "lag_max", "policy_lag")),
    ("clip rate", ("loss_clip_rate", "clip_rate")),
    ("step time (s)", ("time_rollout_s", "time_learner_s")),
)
#: metrics drawn as a trailing rolling mean of this many steps (S1 plots its score so)
ROLLING_STEPS = {"solved_rate": 5}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=0.9)
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.titleweight": "bold"})
    return plt, sns


def _save(plt, fig, out: Path) -> None:
    """Render to memory, then write atomically: a crash never leaves a truncated PNG behind."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write_bytes(out, buffer.getvalue())
    umask = os.umask(0)
    os.umask(umask)
    out.chmod(0o666 & ~umask)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _bar_panel(ax, rows: list[tuple[str, float, str]], color: str, title: str) -> None:
    # Plain barh inside the seaborn theme: seaborn.barplot costs ~10x more per panel here.
    labels = [_wrap(label, 34) for label, _, _ in rows]
    values = [value if math.isfinite(value) else 0.0 for _, value, _ in rows]
    positions = list(range(len(rows)))[::-1]
    ax.barh(positions, values, color=color, height=0.6)
    ax.set_yticks(positions, labels)
    finite = [v for _, v, _ in rows if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if positive and len(positive) == len(finite) and max(positive) / min(positive) > 100:
        ax.set_xscale("log")
    for position, (_, value, text) in zip(positions, rows):
        anchor = value if math.isfinite(value) and value > 0 else 0
        ax.text(anchor, position, f" {text}", va="center", fontsize=7)
    ax.set_title(title, fontsize=8, loc="left")
    ax.tick_params(labelsize=7)
    ax.margins(x=0.25)


def _note_panel(ax, title: str, text: str, color: str) -> None:
    ax.set_axis_off()
    ax.set_title(title, fontsize=8, loc="left")
    ax.text(0.0, 0.5, text, transform=ax.transAxes, fontsize=7, color=color, va="center")


def _published_rows(claim: dict) -> list[tuple[str, float, str]]:
    numeric = [
        v for v in claim["values"] if isinstance(v["value"], int | float) and v.get("role") != "setting"
    ]
    primary = [v for v in numeric if "derived" not in v] or numeric
    if not primary:
        return []
    unit = Counter(v["unit"] for v in primary).most_common(1)[0][0]
    return [
        (f"{v['label']} ({v['unit']})", float(v["value"]), fmt_value(v)) for v in primary if v["unit"] == unit
    ]


def _measured_rows(verdict: Verdict) -> list[tuple[str, float, str]]:
    return [
        (m.label, float(m.value), fmt_number(m.value))
        for m in verdict.measured
        if m.passed is not None and m.value is not None
    ]


def _wrap(text: str, width: int = 70) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def published_vs_reproduced(plt, claims: list[dict], verdicts: dict[str, Verdict], out: Path) -> bool:
    """One row per claim that has published numbers or measured values; False if none has."""
    claims = [c for c in claims if _published_rows(c) or _measured_rows(verdicts[c["id"]])]
    if not claims:
        return False
    rows = len(claims)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 1.7 * rows + 0.3), squeeze=False)
    for row, claim in enumerate(claims):
        verdict = verdicts[claim["id"]]
        left, right = axes[row]
        published = _published_rows(claim)
        pub_title = _wrap(f"{claim['id']} -- published @ {scale_text(claim['published_scale'])}", 80)
        if published:
            _bar_panel(left, published, PUBLISHED_COLOR, pub_title)
        else:
            _note_panel(left, pub_title, _wrap("qualitative: " + claim["direction"], 60), PUBLISHED_COLOR)
        measured = _measured_rows(verdict)
        if verdict.scale is not None and measured:
            title = f"reproduced @ {verdict.scale}" + (f", {verdict.steps} steps" if verdict.steps else "")
            color = SCALE_COLORS.get(verdict.scale, SCALE_COLORS["mini"])
            _bar_panel(right, measured, color, f"{title}: {verdict.verdict}")
        elif verdict.verdict == "out-of-reach":
            _note_panel(
                right,
                "out of reach",
                _wrap("needs: " + "; ".join(verdict.needs)),
                VERDICT_COLORS["out-of-reach"],
            )
        else:
            _note_panel(
                right,
                "not run",
                _wrap(f"{verdict.reason}") + f"\nrun: {verdict.command}",
                VERDICT_COLORS["not-run"],
            )
    fig.subplots_adjust(
        left=0.17,
        right=0.98,
        wspace=0.75,
        hspace=0.9,
        top=1 - 0.35 / (1.7 * rows + 0.3),
        bottom=0.25 / (1.7 * rows + 0.3),
    )
    _save(plt, fig, out)
    return True


def _curve_frame(sources: list[tuple[str, DataDir]]):
    """Long-form rows (step, value, metric, series, family); series = run[/arm][:in-record arm]."""
    import pandas as pd

    family_of = {name: title for title, names in CURVE_FAMILIES for name in names}
    rows, nonfinite = [], []
    for label, data in sources:
        recent: dict[str, deque] = {}  # key -> its last ROLLING_STEPS values (finite ones)
        for index, record in enumerate(data.records):
            step = record.get("step", index)
            if isinstance(step, bool) or not isinstance(step, int | float):
                step = index  # as the verdicts read it (runs.metric_series)
            for key, value in record.items():
                if key in ("step", "arm") or isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                arm, _, base = key.rpartition(".")
                arm = arm or str(record.get("arm", ""))
                if base in family_of:
                    if base in ROLLING_STEPS and math.isfinite(value):
                        window = recent.setdefault(key, deque(maxlen=ROLLING_STEPS[base]))
                        window.append(float(value))
                        value = sum(window) / len(window)
                    series = f"{label}:{arm}" if arm else label
                    # a line cannot show inf or NaN: counted here and named on the panel instead
                    target = rows if math.isfinite(value) else nonfinite
                    target.append((step, float(value), base, series, family_of[base]))
    columns = ["step", "value", "metric", "series", "family"]
    return pd.DataFrame(rows, columns=columns), pd.DataFrame(nonfinite, columns=columns)


def training_curves(plt, sns, title: str, sources: list[tuple[str, DataDir]], out: Path) -> bool:
    frame, nonfinite = _curve_frame(sources)
    if frame.empty and nonfinite.empty:
        return False
    families = [name for name, _ in CURVE_FAMILIES if name in set(frame["family"]) | set(nonfinite["family"])]
    cols = min(3, len(families))
    nrows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.1 * nrows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        part = frame[frame["family"] == family]
        style = "metric" if part["metric"].nunique() > 1 else None
        if not part.empty:
            # several runs under one label are an arm's seeds: mean line, min..max band ("pi", 100)
            sns.lineplot(
                data=part, x="step", y="value", hue="series", style=style, ax=ax, errorbar=("pi", 100),
                linewidth=1.2,
            )  # fmt: skip
        positive = part["value"][part["value"] > 0]
        if len(positive) and positive.max() / positive.min() > 1e3:
            ax.set_yscale("symlog", linthresh=float(positive.min()))
        ax.set_title(family, fontsize=9)
        if not part.empty:
            ax.legend(fontsize=6)
        missing = nonfinite[nonfinite["family"] == family]
        if not missing.empty:
            counts = missing.groupby(["series", "metric"]).size()
            text = "not drawn (non-finite):\n" + "\n".join(
                f"{series} {metric}: {count} steps" for (series, metric), count in counts.items()
            )
            ax.text(0.01, 0.99, text, transform=ax.transAxes, fontsize=5, va="top", color="crimson")
    for ax in list(axes.flat)[len(families) :]:
        ax.set_axis_off()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(plt, fig, out)
    return True


def _curve_sources(runs: list[Run]) -> dict[str, list[tuple[str, DataDir]]]:
    """Per scale: every data dir once, labelled by its path below the scale directory.

    The scale group's unseeded arms are runs of their own (drawn as such); its seeded arms are not.
    Every seed of a seeded arm carries the arm's label, so :func:`training_curves` draws the arm once.
    """
    by_scale: dict[str, list[tuple[str, DataDir]]] = {}
    for run in runs:
        sources = []
        if not run.is_scale_group:
            if run.own:
                sources.append((run.name, run.own))
            sources.extend((f"{run.name}/{arm}", data) for arm, data in run.arms.items())
        prefix = "" if run.is_scale_group else f"{run.name}/"
        for arm, seeds in run.seeds.items():
            # one series per arm: its line is the mean over seeds, its band their min..max
            sources.extend((f"{prefix}{arm} ({len(seeds)} seeds)", data) for _, data in seeds)
        if sources:
            by_scale.setdefault(run.scale, []).extend(sources)
    return by_scale


def throughput_ratios(plt, sns, registry: Registry, verdicts: dict[str, Verdict], out: Path) -> list[str]:
    import pandas as pd

    rows, claim_ids = [], []
    for claim in registry.claims:
        for value in claim["values"]:
            if not value.get("throughput"):
                continue
            claim_ids.append(claim["id"])
            name = f"{claim['id']}\n{value['label']}\npublished @ {claim['published_scale']['model']}"
            rows.append((name, float(value["value"]), "published"))
            verdict = verdicts[claim["id"]]
            if verdict.speed_ratio is not None:
                rows.append((name, verdict.speed_ratio, f"reproduced @ {verdict.scale}"))
    if not rows:
        return []
    frame = pd.DataFrame(rows, columns=["claim", "ratio", "origin"])
    origins = ["published"] + sorted({o for o in frame["origin"] if o != "published"})
    palette = {
        o: PUBLISHED_COLOR if o == "published" else SCALE_COLORS.get(o.split("@ ")[-1], SCALE_COLORS["mini"])
        for o in origins
    }
    fig, ax = plt.subplots(figsize=(9, 0.9 * len(set(frame["claim"])) + 1.2))
    sns.barplot(
        data=frame,
        y="claim",
        x="ratio",
        hue="origin",
        hue_order=origins,
        palette=palette,
        ax=ax,
        orient="h",
        errorbar=None,
    )
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    for container in ax.containers:
        ax.bar_label(container, fmt="%.3g", fontsize=7, padding=2)
    ax.set_xlabel("speed ratio (aligned or async / baseline; > 1 = faster)")
    ax.set_ylabel("")
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Throughput ratios: published vs reproduced", fontsize=10)
    fig.tight_layout()
    _save(plt, fig, out)
    return claim_ids


def make_figures(
    registry: Registry, verdicts: list[Verdict], results_root: Path, out_root: Path | None = None
) -> dict:
    """Draw every figure from the runs under ``results_root`` into ``out_root/figures/`` (default:
    ``results_root``; :func:`.report.build_all` passes a staging directory); returns paths relative
    to the root for the reports.

    ``{"experiments": {exp: path}, "runs": {scale_dir_rel: path}, "throughput": path | None,
    "claims": {claim_id: [paths]}}``
    """
    plt, sns = _pyplot()
    out_root = results_root if out_root is None else out_root
    out_dir = out_root / FIGURES_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    by_id = {v.claim_id: v for v in verdicts}
    index: dict = {"experiments": {}, "runs": {}, "throughput": None, "claims": {cid: [] for cid in by_id}}
    for experiment in registry.experiments:
        claims = [c for c in registry.for_experiment(experiment) if c["id"] in by_id]
        if not claims:
            continue
        name = f"{FIGURES_DIR}/{safe_name(experiment)}__published_vs_reproduced.png"
        if published_vs_reproduced(plt, claims, by_id, out_root / name):
            index["experiments"][experiment] = name
            for claim in claims:
                index["claims"][claim["id"]].append(name)
        for scale, sources in sorted(_curve_sources(all_runs(results_root, experiment)).items()):
            stem = "__".join(safe_name(part) for part in ("curves", experiment, scale))
            curve = f"{FIGURES_DIR}/{stem}.png"
            if training_curves(plt, sns, f"{experiment} / {scale}", sources, out_root / curve):
                index["runs"][f"reproduced/{experiment}/{scale}/"] = curve
    for verdict in verdicts:
        curve = index["runs"].get(f"reproduced/{verdict.experiment}/{verdict.scale}/")
        if curve:
            index["claims"][verdict.claim_id].append(curve)
    name = f"{FIGURES_DIR}/throughput_ratios.png"
    for claim_id in throughput_ratios(plt, sns, registry, by_id, out_root / name):
        index["throughput"] = name
        if claim_id in index["claims"] and name not in index["claims"][claim_id]:
            index["claims"][claim_id].append(name)
    return index
