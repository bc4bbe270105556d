"""report.html in a real headless browser: the claims table renders with its verdict badges.

Needs Debian's ``chromium``; skipped with a reason where it is absent. The screenshot check looks
for the exact badge fill colours from report.html's CSS, which only appear if the page was laid
out and painted with its styles; the DOM check counts the claim rows chromium parsed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from audit_helpers import deepseek_records, write_run

from zeromismatch.audit import build_all, load_registry

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs the Debian 'chromium' browser; not installed here"
)

# Badge backgrounds from zeromismatch/audit/html.py's CSS.
BADGE_RGB = {
    "reproduced-exact": (0x1A, 0x7F, 0x37),
    "reproduced-direction": (0x2D, 0xA4, 0x4E),
    "not-reproduced": (0xCF, 0x22, 0x2E),
    "not-run": (0x6E, 0x77, 0x81),
    "out-of-reach": (0x82, 0x50, 0xDF),
}


def _chromium(tmp_path: Path, profile: str, *args: str) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / profile}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


@pytest.fixture
def built_report(results):
    write_run(results, "deepseek_v4_flash_100steps", "mini", "run-a", records=deepseek_records(120))
    build_all(results, quiet=True)
    return results / "report.html"


def test_screenshot_shows_the_styled_claims_table(built_report, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    out = _chromium(
        tmp_path, "profile-shot", f"--screenshot={shot}", "--window-size=1400,2400", built_report.as_uri()
    )
    assert shot.exists(), out.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 2400)
    colors = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}
    assert len(colors) > 50, "screenshot is (nearly) blank"
    # The top of the page holds the verdict legend and the first table rows: every badge colour
    # (legend) must be painted, proving the stylesheet applied.
    missing = [name for name, rgb in BADGE_RGB.items() if rgb not in colors]
    assert not missing, f"badge colours not painted: {missing}"


def test_dump_dom_has_one_row_per_claim(built_report, tmp_path, results):
    out = _chromium(tmp_path, "profile-dom", "--dump-dom", built_report.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r'<tr class="claim" data-claim-id="([^"]+)" data-verdict="([^"]+)"', out.stdout)
    ids = [c["id"] for c in load_registry(results).claims]
    assert [claim_id for claim_id, _ in rows] == ids
    verdicts = dict(rows)
    assert verdicts["S1-dsv4-zero-diff-every-step"] == "reproduced-exact"
    assert verdicts["S3-coverage-amd-mi355x"] == "out-of-reach"
