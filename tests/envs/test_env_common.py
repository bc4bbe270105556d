"""Protocol properties every env must have: seeded determinism, disjoint splits, demonstrations earn 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zeromismatch.envs import ENVS, Demonstration, default_tokenizer, make_env

NAMES = sorted(ENVS)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_task_across_instances(name):
    first, second = make_env(name), make_env(name)
    for split in ("train", "eval"):
        for seed in range(20):
            assert first.task(seed, split) == second.task(seed, split)
            assert first.reset(seed, split) == second.reset(seed, split)


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_give_varied_tasks(name):
    env = make_env(name)
    prompts = {env.task(seed).prompt for seed in range(50)}
    assert len(prompts) >= 25, f"{name}: only {len(prompts)} distinct prompts in 50 seeds"


@pytest.mark.parametrize("name", NAMES)
def test_train_and_eval_prompts_are_disjoint(name):
    env = make_env(name)
    train = {env.task(seed, "train").prompt for seed in range(300)}
    evaluation = {env.task(seed, "eval").prompt for seed in range(100)}
    assert train and evaluation
    assert not train & evaluation
    assert all(env.split_of(env.task(seed, "eval")) == "eval" for seed in range(20))


@pytest.mark.parametrize("name", NAMES)
def test_train_and_eval_split_keys_are_disjoint(name):
    # the split key is what decides the answer; an eval task must not share it with any train task
    env = make_env(name)
    train = {env.split_key(env.task(seed, "train")) for seed in range(300)}
    evaluation = {env.split_key(env.task(seed, "eval")) for seed in range(100)}
    assert train and evaluation and not train & evaluation


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", ["train", "eval"])
def test_demonstrations_earn_reward_one_when_replayed(name, split):
    env = make_env(name)
    demos = env.demonstrations(25, seed=3, split=split)
    assert len(demos) == 25 and all(isinstance(d, Demonstration) for d in demos)
    replay = make_env(name)
    for index, demo in enumerate(demos):
        assert replay.reset(3 + index, split) == demo.prompt
        for turn, (action, observation) in enumerate(demo.turns):
            result = replay.step(action)
            assert result.observation == observation
            assert result.done == (turn == len(demo.turns) - 1)
        assert result.reward == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_demonstrations_are_deterministic_and_tokenizable(name):
    tokenizer = default_tokenizer()
    first = make_env(name).demonstrations(10, seed=0)
    assert first == make_env(name).demonstrations(10, seed=0)
    for demo in first:
        text = demo.prompt + demo.response
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert "".join(text for text, _ in demo.segments()) == demo.response
        assert demo.segments()[-1][1] is True  # the model writes the last turn


@pytest.mark.parametrize("name", NAMES)
def test_wrong_action_gets_zero_and_episode_rules(name):
    env = make_env(name)
    env.reset(0)
    result = env.step("I do not know")
    assert result.done and result.reward == 0.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("again")
    with pytest.raises(RuntimeError, match="call reset"):
        make_env(name).step("x")
    with pytest.raises(ValueError, match="split"):
        env.reset(0, "test")
    with pytest.raises(ValueError, match="seed"):
        env.reset(-1)
    with pytest.raises(TypeError, match="action must be str"):
        env.reset(0)
        env.step(5)


def test_make_env_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown env"):
        make_env("chess")


def test_tasks_do_not_depend_on_the_process_hash_seed():
    # str hashing is salted per process; tasks must come from the seed alone
    script = (
        "from zeromismatch.envs import ENVS, make_env\n"
        "for name in sorted(ENVS):\n"
        "    env = make_env(name)\n"
        "    print(repr([env.task(s, sp).prompt for sp in ('train', 'eval') for s in range(5)]))\n"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    ]
    here = "".join(
        repr([make_env(name).task(s, sp).prompt for sp in ("train", "eval") for s in range(5)]) + "\n"
        for name in NAMES
    )
    assert outputs[0] == outputs[1] == here
