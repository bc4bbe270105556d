"""The Ray executor (real Ray actors) gives the same bits as the in-process executor."""

from __future__ import annotations

import json

import pytest
import torch
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train

pytestmark = [pytest.mark.slow, pytest.mark.cluster("ray")]


@pytest.mark.parametrize("lag", [0, 2])
def test_ray_matches_inprocess(tmp_path, ray_session, lag):
    """lag 2 over 6 steps: rollouts of later batches overlap learner updates and the driver's
    in-flight window fills and drains, the case that could go wrong; lag 0 is the sync pipeline."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run one torch thread each
    try:
        inproc = train(tiny_config(steps=6, lag=lag), tmp_path / "inprocess", quiet=True)
    finally:
        torch.set_num_threads(threads)
    ray_summary = train(tiny_config(steps=6, lag=lag, executor="ray"), tmp_path / "ray", quiet=True)
    assert ray_summary["weights_sha256"] == inproc["weights_sha256"]
    assert read_metrics(tmp_path / "ray") == read_metrics(tmp_path / "inprocess")
    assert json.loads((tmp_path / "ray" / "summary.json").read_text())["executor"] == "ray"
