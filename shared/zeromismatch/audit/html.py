"""``results/report.html``: REPORT.md's blocks (``report.report_blocks``) as one self-contained page.

Inline CSS, no scripts, no external resources (figures are relative ``figures/*.png`` links), so
it renders offline and in a headless browser. The claims table is ``<table id="claims">``; each
row is ``<tr class="claim" data-claim-id=... data-verdict=...>``.
"""

from __future__ import annotations

from .document import to_html
from .registry import Registry
from .report import report_blocks
from .text import measured_short
from .verdicts import Verdict

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1f2328;
       background: #ffffff; line-height: 1.4; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 15px; margin-top: 20px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { border: 1px solid #d0d7de; padding: 4px 6px; vertical-align: top; text-align: left; }
th { background: #f6f8fa; }
tr.claim:nth-child(even) { background: #fbfbfc; }
.verdict { display: inline-block; padding: 1px 6px; border-radius: 10px; color: #ffffff; font-weight: 600;
           white-space: nowrap; }
.v-reproduced-exact { background: #1a7f37; } .v-reproduced-direction { background: #2da44e; }
.v-not-reproduced { background: #cf222e; } .v-not-run { background: #6e7781; }
.v-out-of-reach { background: #8250df; }
code { background: #f6f8fa; padding: 0 3px; border-radius: 3px; font-size: 11px; }
img { max-width: 100%; border: 1px solid #d0d7de; margin: 6px 0; }
.detail { margin-left: 8px; font-size: 13px; } .detail li { margin: 2px 0; }
"""


def render_html(
    registry: Registry, verdicts: list[Verdict], figures: dict, benchmarks: list[str] | None = None
) -> str:
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>zeromismatch: published claims vs reproduction</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    body = to_html(report_blocks(registry, verdicts, figures, benchmarks))
    return "\n".join([*head, body, "</body></html>\n"])


__all__ = ["render_html", "measured_short"]
