"""make_all: figures rendered headless, every claim id in REPORT.md and report.html, missing runs."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from audit_helpers import deepseek_records, run_make_all, write_benchmark, write_run

from zeromismatch.audit import build_all, load_registry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _ClaimRows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: dict[str, str] = {}
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-claim-id" in attrs:
            self.rows[attrs["data-claim-id"]] = attrs["data-verdict"]
        if tag == "img":
            self.images.append(attrs["src"])


def _claim_ids(results):
    return [c["id"] for c in load_registry(results).claims]


def test_report_with_no_runs_lists_every_claim_as_not_run_or_out_of_reach(results):
    build = build_all(results, quiet=True)
    md = (results / "REPORT.md").read_text()
    page = (results / "report.html").read_text()
    parser = _ClaimRows()
    parser.feed(page)
    ids = _claim_ids(results)
    for claim_id in ids:
        assert claim_id in md and claim_id in page
    assert list(parser.rows) == ids
    assert set(parser.rows.values()) == {"not-run", "out-of-reach"}
    assert "run: python experiments/deepseek_v4_flash_100steps/launch.py --scale mini" in md
    verdicts = json.loads((results / "verdicts.json").read_text())
    assert sorted(verdicts["claims"]) == sorted(ids)
    for image in parser.images:
        assert (results / image).read_bytes()[:8] == PNG_MAGIC
    assert build.figures["throughput"] == "figures/throughput_ratios.png"
    assert build.figures["runs"] == {}


def test_report_with_runs_draws_curves_and_links_runs(results):
    write_run(results, "deepseek_v4_flash_100steps", "mini", "run-a", records=deepseek_records(120))
    # reinforce_zero_lag64 in the layout zeromismatch.rl.loop produces: one run directory per arm.
    for arm in ("aligned", "default"):
        records = [
            {
                "step": s,
                "reward_mean": 0.1 + 0.01 * s,
                "grad_norm_preclip": 0.05 if arm == "aligned" else 1 + s,
                "peak_over_median": 1.4 if arm == "aligned" else 10.0 + s,
                "k3_kl": 0.0 if arm == "aligned" else 1e-3 * s,
                "loss": 0.5,
                "gap_kernel_abs_max": 0.0 if arm == "aligned" else 1e-4,
            }
            for s in range(40)
        ]
        after = 0.5 if arm == "aligned" else 0.1
        summary = {"eval_pass_at_1_before": 0.3, "eval_pass_at_1_after": after}
        write_run(results, "reinforce_zero_lag64", "mini", arm, records=records, summary=summary)
    write_benchmark(results, "async", {"async_over_sync": 1.7})
    build = build_all(results, quiet=True)
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"
    curves = build.figures["runs"]
    assert set(curves) == {
        "reproduced/deepseek_v4_flash_100steps/mini/",
        "reproduced/reinforce_zero_lag64/mini/",
    }
    for path in curves.values():
        assert (results / path).read_bytes()[:8] == PNG_MAGIC
    md = (results / "REPORT.md").read_text()
    page = (results / "report.html").read_text()
    assert (
        "[reproduced/deepseek_v4_flash_100steps/mini/run-a/](reproduced/deepseek_v4_flash_100steps/mini/run-a/)"
        in md
    )
    assert 'href="reproduced/reinforce_zero_lag64/mini/"' in page  # the per-arm runs as one group
    assert "git 0123456789abcdef0123456789abcdef01234567" in md
    assert "([provenance](reproduced/deepseek_v4_flash_100steps/mini/run-a/provenance.json))" in md
    assert 'href="reproduced/reinforce_zero_lag64/mini/default/provenance.json"' in page
    assert 'href="reproduced/reinforce_zero_lag64/mini/aligned/provenance.json"' in page
    parser = _ClaimRows()
    parser.feed(page)
    assert parser.rows["S1-dsv4-zero-diff-every-step"] == "reproduced-exact"
    assert parser.rows["S3-grad-norm-38.27-vs-0.0555"] == "reproduced-direction"
    assert parser.rows["S3-async-throughput-2.40x"] == "reproduced-direction"
    assert parser.rows["S3-default-aime24-34.27-to-13.96"] == "reproduced-direction"
    assert parser.rows["S3-kernel-mismatch-survives-is"] == "reproduced-exact"
    assert parser.rows["S1-dsv4base-reward-fell"] == "not-reproduced"
    assert "figures/curves__reinforce_zero_lag64__mini.png" in page


@pytest.mark.slow
def test_rebuild_is_deterministic_and_drops_stale_figures(results):
    run = write_run(results, "deepseek_v4_flash_100steps", "mini", "run-a", records=deepseek_records(120))
    build_all(results, quiet=True)
    first = {name: (results / name).read_bytes() for name in ("REPORT.md", "report.html", "verdicts.json")}
    build_all(results, quiet=True)
    assert first == {name: (results / name).read_bytes() for name in first}
    curve = results / "figures" / "curves__deepseek_v4_flash_100steps__mini.png"
    assert curve.exists()
    for path in run.iterdir():
        path.unlink()
    run.rmdir()
    build_all(results, quiet=True)
    assert not curve.exists()


def test_make_all_script_runs_headless_and_quiet(results):
    out = run_make_all(results, env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "TkAgg"})
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert (results / "REPORT.md").exists() and (results / "report.html").exists()


def test_make_all_bad_summary_is_one_error_naming_the_file(results):
    run = write_run(results, "osworld_step_time", "mini", "r", records=[{"step": 0}])
    (run / "summary.json").write_text("[1, 2")
    out = run_make_all(results)
    assert out.returncode == 2
    assert "osworld_step_time/mini/r/summary.json" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("missing", ["published"])
def test_missing_published_directory_is_a_clear_error(tmp_path, missing):
    from zeromismatch.audit import AuditInputError

    with pytest.raises(AuditInputError, match="no published-claims directory"):
        build_all(tmp_path / "results", quiet=True)
