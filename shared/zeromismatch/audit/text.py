"""Plain-text renderings shared by the terminal table, REPORT.md and report.html."""

from __future__ import annotations

import math
import re

from .verdicts import Verdict

TABLE_COLUMNS = (
    "claim",
    "source",
    "published",
    "published scale",
    "reproduced",
    "our scale",
    "verdict",
    "run / next step",
)
_QUALIFIER = {"=": "", "~": "~", ">": ">", "<": "<", ">=": ">=", "<=": "<="}


_FULL_HASH = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{28}\b")


def short_commit(commit: object) -> str:
    """A recorded git_commit with each full 40-hex hash cut to 12 characters and everything else
    kept: "-dirty" and "(stated by ZEROMISMATCH_GIT_COMMIT; local git: ...)" are part of the record."""
    return _FULL_HASH.sub(r"\1", str(commit))


def fmt_number(value: object) -> str:
    """Published numbers as the source wrote them where possible; measured ones to 4 significant digits."""
    if isinstance(value, str):
        return value
    if value is None:
        return "n/a"
    number = float(value)  # type: ignore[arg-type]
    if number == 0:
        return "0"
    if not math.isfinite(number):
        return str(number)
    if abs(number) < 1e-2 or abs(number) >= 1e5:
        return f"{number:.4g}"
    return f"{number:.6g}"


def fmt_value(value: dict) -> str:
    unit = value["unit"]
    number = value.get("number_as_written") or fmt_number(value["value"])
    if unit == "%":
        text = f"{number}%"
    elif unit == "x":
        text = f"{number}x"
    elif unit in ("version",):
        text = number
    else:
        text = f"{number} {unit}"
    text = _QUALIFIER.get(value.get("qualifier", "="), "") + text
    for alt in value.get("alternatives", []):
        text += f" ({fmt_number(alt['value'])} in {alt['where']})"
    if "derived" in value:
        text += f" [derived: {value['derived']['formula']}]"
    return text


def published_short(claim: dict) -> str:
    """One line of published numbers: 'before -> after' pairs, else 'label value' items."""
    values = [v for v in claim["values"] if v.get("role") != "setting" or claim["kind"] == "setting"]
    if not values:
        return "(qualitative)"
    before = [v for v in values if v.get("role") == "before"]
    after = [v for v in values if v.get("role") == "after"]
    if before and after:
        text = f"{fmt_value(before[0])} -> {fmt_value(after[0])}"
        rest = [v for v in values if v not in (before[0], after[0]) and "derived" not in v]
    else:
        text, rest = "", values
    items = [f"{v['label']}: {fmt_value(v)}" for v in rest]
    return "; ".join(x for x in [text, *items] if x)


def scale_text(scale: dict) -> str:
    stated_model = scale["model"] != "not stated"
    parts = [scale["model"]] if stated_model else []
    if scale.get("gpus"):
        parts.append(f"{scale['gpus']} GPUs")
    updates = scale.get("updates")
    if updates:
        qualifier = _QUALIFIER.get(updates.get("qualifier", "="), "")
        parts.append(f"{qualifier}{updates['value']:,} updates")
    if scale.get("context_tokens"):
        parts.append(f"{scale['context_tokens']} context tokens")
    if scale.get("hardware"):
        parts.append(scale["hardware"])
    missing = [
        name
        for name, known in (
            ("model", stated_model),
            ("GPUs", scale.get("gpus")),
            ("updates", scale.get("updates")),
        )
        if not known
    ]
    if missing:
        parts.append(f"{', '.join(missing)} not stated")
    return ", ".join(parts)


def measured_short(verdict: Verdict) -> str:
    if not verdict.measured:
        return "-"
    items = [f"{m.label} = {fmt_number(m.value)}" for m in verdict.measured if m.passed is not None]
    return "; ".join(items) or "-"


def repro_scale_text(verdict: Verdict) -> str:
    if verdict.scale is None:
        return "-"
    parts = [verdict.scale]
    if verdict.steps:
        parts.append(f"{verdict.steps} steps")
    hardware = verdict.provenance.get("hardware", {})
    if hardware.get("gpu"):
        parts.append(str(hardware["gpu"]))
    elif hardware.get("cpu_model"):
        parts.append("CPU")
    return ", ".join(parts)


def next_step(verdict: Verdict) -> str:
    """What a reader can do about the verdict: the command to run, or what is missing."""
    if verdict.verdict == "out-of-reach":
        return "needs: " + "; ".join(verdict.needs)
    if verdict.verdict == "not-run":
        return f"run: {verdict.command}"
    return verdict.run or "-"
