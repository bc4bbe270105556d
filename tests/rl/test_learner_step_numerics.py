"""The numbers a learner step uses and reports:

- RL starts with fresh Adam moments (the warm start has its own optimizer), so a step whose
  gradient is exactly zero moves no weight;
- at lag > 0 with top-k, tokens outside the current policy's support weigh 0 but their responses
  stay in the batch (dropping them would change B, |y_i| and the group baselines);
- the run summary's maxima keep a nan step wherever it falls, and a sampled token the trainer
  gives probability zero is an infinite diff, not a dropped one.
"""

from __future__ import annotations

import torch
from rl_helpers import tiny_config

from zeromismatch.rl.learner import Learner, state_snapshot
from zeromismatch.rl.loop import RolloutWorker, run_sft


def _episodes(config, learner, version=0):
    worker = RolloutWorker(config)
    worker.set_weights(state_snapshot(learner.model), version)
    return worker.generate(0)


def test_rl_starts_with_a_fresh_optimizer_and_a_zero_gradient_step_moves_nothing():
    config = tiny_config(sft_steps=3, sft_batch=4)
    torch.manual_seed(config.seed)
    learner = Learner(config)
    run_sft(config, learner)
    assert learner.optimizer.state == {}  # no Adam moments carried over from the warm start
    episodes = _episodes(config, learner)
    for episode in episodes:
        episode.reward = 0.0  # every group flat: every advantage is exactly 0
    before = state_snapshot(learner.model)
    stats = learner.rl_step(episodes, None)
    after = state_snapshot(learner.model)
    assert stats["grad_norm_preclip"] == 0.0
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_unsupported_tokens_at_lag_keep_every_response_in_the_batch():
    config = tiny_config(lag=1, top_k=2, temperature=1.5, lr=0.2, prompts_per_step=4, group_size=4)
    torch.manual_seed(config.seed)
    learner = Learner(config)
    snapshot = state_snapshot(learner.model)
    episodes = _episodes(config, learner)
    for i, episode in enumerate(episodes):
        episode.reward = float(i % 2)
    learner.rl_step(episodes, None)  # one big step: the top-2 support moves under the old batch
    stats = learner.rl_step(episodes, snapshot)
    assert stats["out_of_support_tokens"] > 0
    assert stats["loss_responses"] == len(episodes)
    assert stats["tokens"] == sum(sum(ep.model_mask) for ep in episodes)
    assert stats["diff_max"] == 0.0  # the kernel term is still exactly zero on the aligned stack


def test_summary_maxima_show_a_nan_step_wherever_it_falls():
    """Python's max keeps a nan only when it comes first, so a blown-up pre-clip gradient norm at a
    later step would vanish from grad_norm_preclip_max."""
    import math

    from zeromismatch.rl.loop import summarize

    def record(grad_norm, diff):
        return {
            "diff_max": diff, "diff_mean": diff, "diff_std": diff, "k3_kl": diff,
            "peak_over_median": 1.0, "grad_norm_preclip": grad_norm, "reward_mean": 0.5,
            "time_rollout_s": 0.1, "time_learner_s": 0.1,
        }  # fmt: skip

    evals = {"eval_pass_at_1": 0.0}
    for order in ([0.5, math.nan, 0.3], [math.nan, 0.5, 0.3], [0.3, 0.5, math.nan]):
        summary = summarize([record(g, 0.0) for g in order], "sha", evals, evals, [])
        assert math.isnan(summary["grad_norm_preclip_max"]), order
    clean = summarize([record(g, 0.0) for g in (0.5, 0.7)], "sha", evals, evals, [])
    assert clean["grad_norm_preclip_max"] == 0.7 and clean["diff_max_max_over_steps"] == 0.0
    assert math.isnan(
        summarize([record(0.5, 0.0), record(0.5, math.nan)], "sha", evals, evals, [])[
            "diff_max_max_over_steps"
        ]
    )
    assert summarize([], "sha", evals, evals, [])["grad_norm_preclip_max"] is None


def test_a_sampled_token_the_trainer_gives_probability_zero_is_an_infinite_diff(monkeypatch):
    # dropped from diff_*/k3_kl, a step with an infinite mismatch would report exact zeros
    import math

    from zeromismatch.rl.loop import summarize

    config = tiny_config(top_k=4)
    torch.manual_seed(config.seed)
    learner = Learner(config)
    episodes = _episodes(config, learner)
    for i, episode in enumerate(episodes):
        episode.reward = float(i % 2)
    recompute = learner._recompute

    def outside_the_support(model, batch, requires_grad):
        logprobs = recompute(model, batch, requires_grad)
        first = logprobs[0]
        logprobs[0] = torch.where(torch.arange(len(first)) == 0, torch.tensor(-math.inf), first)
        return logprobs

    monkeypatch.setattr(learner, "_recompute", outside_the_support)
    stats = learner.rl_step(episodes, None)
    assert stats["kernel_out_of_support_tokens"] == 1 and stats["lag_out_of_support_tokens"] == 0
    assert stats["diff_max"] == math.inf and stats["k3_kl"] == math.inf
    assert stats["gap_kernel_abs_max"] == math.inf  # the decomposition's kernel term says so too
    record = dict(stats, reward_mean=0.5, time_rollout_s=0.0, time_learner_s=0.0)
    evaluation = {"eval_pass_at_1": 0.0}
    assert summarize([record], "hash", evaluation, evaluation, [])["steps_with_zero_mismatch"] == 0
