"""RL batches draw train-split tasks the SFT warm start never demonstrated."""

from __future__ import annotations

from zeromismatch.rl import RLConfig
from zeromismatch.rl.loop import task_seeds_for_batch


def test_rl_task_seeds_start_past_the_sft_demonstrations():
    config = RLConfig(env="tools", sft_steps=30, sft_batch=16, prompts_per_step=8, steps=50)
    sft_seeds = set(range(config.sft_steps * config.sft_batch))  # run_sft: step * sft_batch + i
    rl_seeds = [s for b in range(config.steps) for s in task_seeds_for_batch(config, b)]
    assert not sft_seeds & set(rl_seeds)
    assert len(set(rl_seeds)) == len(rl_seeds)  # no prompt repeats across RL batches either
    assert rl_seeds[0] == config.sft_steps * config.sft_batch


def test_without_warm_start_rl_seeds_start_at_zero():
    config = RLConfig(env="tools", sft_steps=0, prompts_per_step=4)
    assert task_seeds_for_batch(config, 0) == [0, 1, 2, 3]
    assert task_seeds_for_batch(config, 2) == [8, 9, 10, 11]
