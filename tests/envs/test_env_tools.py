"""Tools env: calculator turns, errors as observations, final answer reward, truncation."""

from __future__ import annotations

import pytest

from zeromismatch.envs import ToolsEnv
from zeromismatch.envs.safe_eval import safe_eval


def test_tool_call_then_answer():
    env = ToolsEnv()
    env.reset(0)
    expression = env.current_task.data["expression"]
    result = env.step(f"<calc>{expression}</calc>")
    assert not result.done and result.reward == 0.0
    assert result.observation == f"<result>{safe_eval(expression)}</result>\n"
    final = env.step(f"<answer>{env.current_task.answer}</answer>")
    assert final.done and final.reward == 1.0


def test_refused_tool_input_is_an_error_observation_not_a_crash():
    env = ToolsEnv()
    env.reset(1)
    result = env.step("<calc>__import__('os').getcwd()</calc>")
    assert not result.done
    assert result.observation.startswith("<error>") and "not allowed" in result.observation
    assert env.step("<calc>2**1000</calc>").observation.startswith("<error>exponent 1000")


def test_wrong_answer_and_truncation():
    env = ToolsEnv(max_turns=3)
    env.reset(2)
    assert env.step(f"<answer>{env.current_task.answer + 1}</answer>").reward == 0.0
    env.reset(2)
    env.step("<calc>1+1</calc>")
    env.step("<calc>1+1</calc>")
    last = env.step("<calc>1+1</calc>")
    assert last.done and last.reward == 0.0 and last.info["truncated"] is True


def test_answer_without_tool_counts():
    env = ToolsEnv()
    env.reset(4)
    assert env.score(f"<answer>{env.current_task.answer}</answer>") == 1.0


def test_run_episode_with_a_scripted_policy():
    env = ToolsEnv()

    def policy(transcript: str) -> str:
        if "<result>" not in transcript:
            return f"<calc>{transcript[3:].split('=')[0]}</calc>"
        return f"<answer>{transcript.split('<result>')[1].split('</result>')[0]}</answer>"

    transcript, reward = env.run_episode(5, policy, split="eval")
    assert reward == 1.0 and transcript.endswith("</answer>")


def test_bad_configuration():
    with pytest.raises(ValueError, match="max_turns"):
        ToolsEnv(max_turns=1)


def test_max_operand_is_capped_so_every_task_can_be_generated():
    from zeromismatch.envs.tools import MAX_OPERAND

    with pytest.raises(ValueError, match="max_operand"):
        ToolsEnv(max_operand=MAX_OPERAND + 1)
    env = ToolsEnv(max_operand=MAX_OPERAND)  # 10**4 and up used to raise in reset() for some seeds
    for seed in range(300):
        env.reset(seed)
