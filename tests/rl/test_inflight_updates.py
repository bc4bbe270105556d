"""In-flight weight updates in the RL loop (``RLConfig.inflight_update_at_token``, rl/inflight.py).

The update lands while the batch's requests are generated; every token records the version that
sampled it, the lag metrics are per token, and the learner scores each token at its own version, so
an aligned run's kernel term stays exactly 0 at every step. Inverses: scoring the mixed batch at one
version, or with the version map off by one, or the engine on default kernels, is not zero.
"""

from __future__ import annotations

import pytest
import torch
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import RLConfig, train
from zeromismatch.rl.inflight import MixedVersionLearner, VersionedSnapshots, batch_versions, token_versions
from zeromismatch.rl.learner import state_snapshot
from zeromismatch.rl.loop import RolloutWorker

AT = 1  # arithmetic answers are 2-3 tokens: after one step every request is still in flight
KERNEL_KEYS = ("diff_max", "diff_mean", "diff_std", "k3_kl", "gap_kernel_abs_max")


def _config(**changes) -> RLConfig:
    # a short warm start on single-digit sums gives nonzero rewards, so the weights move between versions
    base = dict(steps=4, lag=1, sft_steps=20, prompts_per_step=4, group_size=4, lr=0.05,
                env_options={"max_digits": 1}, inflight_update_at_token=AT)  # fmt: skip
    return tiny_config(**{**base, **changes})


@pytest.fixture(scope="module")
def two_versions():
    """A learner one big RL step past its version 0, and both versions' weights."""
    config = _config(lr=0.2, top_k=0)
    torch.manual_seed(config.seed)
    learner = MixedVersionLearner(config)
    v0 = state_snapshot(learner.model)
    worker = RolloutWorker(config)
    worker.set_weights(v0, 0)
    episodes = worker.generate(0)
    for i, episode in enumerate(episodes):
        episode.reward = float(i % 2)
    learner.rl_step(episodes, None)
    return config, learner, {0: v0, 1: state_snapshot(learner.model)}


def _mixed_batch(config, weights, mode="keep"):
    worker = RolloutWorker(config.replace(update_mode=mode))
    worker.set_weights(weights[0], 0)
    return worker, worker.generate(1, inflight=(weights[1], 1))


def _kernel_diff(learner, episodes, snapshot) -> float:
    # rl_step also updates the learner: score a copy so each call sees the same current weights
    import copy

    return copy.deepcopy(learner).rl_step([copy.deepcopy(ep) for ep in episodes], snapshot)["diff_max"]


def test_schedule_lands_the_next_version_during_the_batch():
    config = _config(lag=3)
    assert [batch_versions(config, b) for b in range(6)] == [(0, 0), (0, 0), (0, 0), (0, 1), (1, 2), (2, 3)]
    # the next batch starts where the previous one ended; off, nothing lands in flight
    assert all(batch_versions(config, b)[1] == batch_versions(config, b + 1)[0] for b in range(3, 40))
    assert batch_versions(config.replace(inflight_update_at_token=0), 5) == (2, 2)


def test_keep_tokens_carry_the_version_that_sampled_them(two_versions):
    config, _, weights = two_versions
    worker, episodes = _mixed_batch(config, weights, "keep")
    assert worker.inflight_stats["inflight_update_at_step"] == AT
    for episode in episodes:  # single turn, admitted together: token AT onwards is the new version
        assert episode.versions == [0] * AT + [1] * (len(episode.versions) - AT)
    assert token_versions(episodes) == [0, 1]


def test_wait_drains_under_the_old_version_and_abort_regenerates_under_the_new(two_versions):
    config, _, weights = two_versions
    _, waited = _mixed_batch(config, weights, "wait")
    assert all(set(ep.versions) == {0} for ep in waited)
    worker, aborted = _mixed_batch(config, weights, "abort")
    # a request done within AT steps was not in flight; every other one was generated again under v1
    regenerated = [ep for ep in aborted if set(ep.versions) == {1}]
    assert all(ep in regenerated or ep.versions == [0] * AT for ep in aborted)
    assert worker.inflight_stats["inflight_regenerated_requests"] == len(regenerated) > 0


def test_each_token_is_scored_at_its_own_version_and_inverses_fail(two_versions):
    config, learner, weights = two_versions
    _, episodes = _mixed_batch(config, weights, "keep")
    assert _kernel_diff(learner, episodes, VersionedSnapshots(weights)) == 0.0
    # inverse: one rollout version for the whole batch (the start version, or the landed one)
    assert _kernel_diff(learner, episodes, weights[0]) > 0.0
    assert _kernel_diff(learner, episodes, weights[1]) > 0.0
    # inverse: the version map off by one
    assert _kernel_diff(learner, episodes, VersionedSnapshots({0: weights[1], 1: weights[0]})) > 0.0
    with pytest.raises(KeyError, match="versions \\[1\\]"):
        _kernel_diff(learner, episodes, VersionedSnapshots({0: weights[0]}))


@pytest.mark.parametrize("mode", ["keep", "wait", "abort"])
def test_aligned_run_with_inflight_updates_has_zero_kernel_term_at_every_step(tmp_path, mode):
    train(_config(update_mode=mode), tmp_path / "run", quiet=True)
    records = read_metrics(tmp_path / "run")
    for record in records:
        assert all(record[key] == 0.0 for key in KERNEL_KEYS), record
    assert [r["inflight_update_at_step"] for r in records] == [None, AT, AT, AT]
    lags = [r["lag_mean"] for r in records[1:]]
    if mode == "keep":  # tokens before the update lag 1, after it 0
        assert all(0.0 < lag < 1.0 for lag in lags), lags
        assert any(r["gap_weight_lag_abs_max"] > 0.0 for r in records[2:])  # the weights did move
    elif mode == "wait":
        assert lags == [1.0] * 3
    else:  # only a request done within AT steps keeps the old version
        assert all(lag < 0.1 for lag in lags)
        assert all(r["inflight_regenerated_requests"] > 0 for r in records[1:])


def test_multi_turn_inflight_run_has_zero_kernel_term(tmp_path):
    config = _config(env="tools", env_options={}, max_new_tokens=6, inflight_update_at_token=3, steps=3)
    train(config, tmp_path / "run", quiet=True)
    records = read_metrics(tmp_path / "run")
    assert all(record[key] == 0.0 for record in records for key in KERNEL_KEYS), records
    assert records[-1]["inflight_update_at_step"] == 3


def test_inverse_default_rollout_kernels_with_inflight_updates_mismatch(tmp_path):
    train(_config(steps=2, rollout_kernels="default"), tmp_path / "run", quiet=True)
    assert any(r["diff_max"] > 0.0 for r in read_metrics(tmp_path / "run"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lag": 0}, "needs lag >= 1"),
        ({"executor": "ray"}, "Ray executor swaps weights between batches only"),
        ({"inflight_update_at_token": -1}, "non-negative int"),
        ({"inflight_update_at_token": 1.5}, "non-negative int"),
        ({"kv_block_size": 0}, "RLConfig.kv_block_size"),
    ],
)
def test_bad_inflight_settings_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message) as err:
        _config(**changes)
    assert str(err.value).startswith(("RLConfig.inflight_update_at_token", "RLConfig.kv_block_size"))
