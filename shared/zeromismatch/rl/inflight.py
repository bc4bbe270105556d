"""In-flight weight updates (S2 fix 3): the weights change while a batch's requests are being generated.

Schedule (``RLConfig.inflight_update_at_token`` = N > 0, lag k >= 1). Batch b starts on learner
version ``v_start(b) = max(0, b - k)``, as without in-flight updates. While it is generated, the learner
finishes the next version, ``v_end(b) = max(0, b - k + 1)`` (it exists: v_end(b) <= b, the learner's
version when batch b is generated); after N engine steps of the batch (in a single-turn batch whose
requests are admitted together, N sampled tokens per request) the engine receives it through
``update_weights(weights, config.update_mode)``:

- "keep": requests carry on under v_end; their K/V is computed again under v_end first (the engine's
  ``recompute_kv=True``), so each token is a function of one version's weights -- the one it records;
- "wait": the update waits for every in-flight request to finish under v_start;
- "abort": in-flight requests are cut off and generated again from their start under v_end.

Batch b+1 then starts on ``v_start(b+1) = v_end(b)``: the worker's version only moves forward, once
per batch, and never further than without in-flight updates one batch later. A batch that finishes
within N steps (or with v_end = v_start: the first k batches) gets no update; the next batch starts on
v_start(b+1) as usual. Per-token versions land in ``Episode.versions``, so ``lag_mean`` / ``lag_max``
(``metrics.mismatch.lag_stats``) are per-token lags against the learner's version: k before the
update, k - 1 after it.

The learner's audit. ``Learner.rl_step(episodes, rollout_snapshot)`` recomputes the "then" logprobs
at one rollout version. A batch of two versions is scored by :class:`MixedVersionLearner` instead:
given a :class:`VersionedSnapshots` (every version the batch's tokens carry -> its weights), it
recomputes the whole batch once per version and keeps, for every token, the logprob at that token's
own version. The kernel term (``diff_*``, ``k3_kl``, ``gap_kernel_*``) is then engine vs trainer at
the same weights token by token -- exactly 0 on an aligned stack -- and the weight-lag term
``trainer(now) - trainer(own version)``; entropy is read at each token's own version too. One extra
no-grad forward per extra version (two per step at most).
"""

from __future__ import annotations

import torch

from .config import RLConfig
from .learner import Learner
from .rollout import Episode


def batch_versions(config: RLConfig, batch_index: int) -> tuple[int, int]:
    """(v_start, v_end) of batch ``batch_index``: the version it starts on and the one that lands in
    flight (equal when no update lands in it)."""
    start = config.weight_version_for_batch(batch_index)
    if not config.inflight_update_at_token:
        return start, start
    return start, max(start, batch_index - config.lag + 1)


class VersionedSnapshots(dict):
    """Learner weights by version, for every version a batch's tokens carry (a ``rollout_snapshot``
    that :class:`MixedVersionLearner` scores token by token)."""


def token_versions(episodes: list[Episode]) -> list[int]:
    """The distinct weight versions of the model-written tokens of ``episodes``, ascending."""
    return sorted({v for ep in episodes for v, m in zip(ep.versions, ep.model_mask) if m})


def rollout_snapshots(versions: list[int], learner_version: int, weights_of) -> object:
    """What ``rl_step`` gets as ``rollout_snapshot`` for a batch whose tokens carry ``versions``:
    None when every token is the learner's current version, the one snapshot when there is one
    version, else a :class:`VersionedSnapshots` (``weights_of(version)`` -> weights)."""
    if versions == [learner_version]:
        return None
    if len(versions) == 1:
        return weights_of(versions[0])
    return VersionedSnapshots({v: weights_of(v) for v in versions})


class MixedVersionLearner(Learner):
    """A :class:`Learner` that also scores batches whose tokens come from several weight versions."""

    def _at_version(self, snapshot, episodes: list[Episode]):
        if not isinstance(snapshot, VersionedSnapshots):
            return super()._at_version(snapshot, episodes)
        if not snapshot:
            raise ValueError("VersionedSnapshots is empty: a batch has at least one version")
        needed = token_versions(episodes)
        missing = sorted(set(needed) - set(snapshot))
        if missing:
            raise KeyError(f"the batch has tokens of versions {missing}, whose weights were not given")
        per_version = {v: super(MixedVersionLearner, self)._at_version(snapshot[v], episodes) for v in needed}
        stitched = []
        for i, ep in enumerate(episodes):
            # env-written tokens (version -1) take the first version's value: they carry no loss and
            # every statistic masks them out
            versions = torch.tensor([v if m else needed[0] for v, m in zip(ep.versions, ep.model_mask)])
            row = per_version[needed[0]][i].clone()
            for v in needed[1:]:
                row = torch.where(versions == v, per_version[v][i], row)
            stitched.append(row)
        return stitched
