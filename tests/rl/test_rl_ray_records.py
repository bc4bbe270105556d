"""The Ray executor records what the in-process executor records, and never strands its actors."""

from __future__ import annotations

import json
import time

import pytest
import torch
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train

pytestmark = [pytest.mark.slow, pytest.mark.cluster("ray")]


def test_ray_logs_mid_run_evals_and_cache_counters(tmp_path, ray_session):
    """eval_every=1 over 3 steps: steps 0 and 1 carry an evaluation (not the last step), in both
    executors, with equal values; the summaries carry the same prefix-cache counters."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run one torch thread each
    try:
        inproc = train(tiny_config(steps=3, lag=1, eval_every=1), tmp_path / "inprocess", quiet=True)
    finally:
        torch.set_num_threads(threads)
    ray_config = tiny_config(steps=3, lag=1, eval_every=1, executor="ray")
    ray_summary = train(ray_config, tmp_path / "ray", quiet=True)
    inproc_records, ray_records = read_metrics(tmp_path / "inprocess"), read_metrics(tmp_path / "ray")
    assert [("eval_pass_at_1" in r) for r in inproc_records] == [True, True, False]
    assert ray_records == inproc_records
    raw = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert ["time_eval_s" in r for r in raw] == [True, True, False]
    for key in ("prefix_cache_hits", "stale_prefix_hits", "weights_sha256"):
        assert ray_summary[key] == inproc[key], key


def test_failed_ray_run_releases_both_cpus(tmp_path, ray_session):
    """A run that fails after its actors exist (here: a bad env option, raised by the learner's
    warm-start eval) kills them, even while the exception and its traceback are still alive;
    otherwise the next Ray run in this process would wait forever for a CPU."""
    with pytest.raises(Exception, match="bogus") as failure:
        train(tiny_config(steps=2, executor="ray", env_options={"bogus": 1}), tmp_path / "bad", quiet=True)
    deadline = time.monotonic() + 30
    while ray_session.available_resources().get("CPU", 0.0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert failure.value is not None  # the traceback (holding the actor handles) is still alive here
    assert ray_session.available_resources().get("CPU", 0.0) == 2
