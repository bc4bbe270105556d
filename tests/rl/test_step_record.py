"""metrics.jsonl lines: where an env grades "solved" apart from the reward (code repair's hidden tests),
each step records the share of its episodes that solved their task beside the reward."""

from __future__ import annotations

import pytest

from zeromismatch.envs import ENVS
from zeromismatch.rl.loop import step_record
from zeromismatch.rl.rollout import Episode


def _episodes(pairs):
    return [
        Episode(group_id=i, task_seed=i, prompt_ids=[1], reward=r, solved=s) for i, (r, s) in enumerate(pairs)
    ]


def test_code_repair_steps_record_the_solved_share_not_the_reward():
    # visible tests all passed is reward 1.0; solved is the hidden tests: the two differ here
    episodes = _episodes([(1.0, False), (0.6, False), (1.0, True), (0.0, False)])
    record = step_record(3, 2, 4, {}, episodes, {"time_rollout_s": 0.0}, "code_repair")
    assert record["solved_rate"] == 0.25 and record["reward_mean"] == pytest.approx(0.65)
    assert (record["step"], record["weight_version"], record["policy_lag"]) == (3, 2, 1)


@pytest.mark.parametrize("env", sorted(name for name, cls in ENVS.items() if not cls.grades_apart))
def test_envs_whose_solved_is_reward_one_record_no_solved_rate(env):
    record = step_record(0, 0, 1, {}, _episodes([(1.0, True), (0.0, False)]), {}, env)
    assert "solved_rate" not in record and record["reward_mean"] == 0.5


def test_only_code_repair_grades_apart():
    assert [name for name, cls in ENVS.items() if cls.grades_apart] == ["code_repair"]
