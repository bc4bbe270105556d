"""Multi-turn tool-use env: a calculator the model calls before answering (the agentic-tools stand-in).

Task: an integer expression that is hard to do "in the head" for a tiny model, from templates such as
``a*b+c``, ``(a+b)*c``, ``a*b-c`` and ``a**k%m``. Prompt ``"Q: 123*45+67=\n"``.

Each turn the model emits exactly one of
- ``<calc>EXPR</calc>``: the env evaluates EXPR with ``safe_eval`` (an ``ast`` interpreter over a
  whitelist; model text is never passed to ``eval``/``exec``) and appends ``<result>VALUE</result>\n``,
  or ``<error>REASON</error>\n`` when EXPR is refused; the episode continues;
- ``<answer>N</answer>``: the episode ends with reward 1.0 iff N is the exact value, else 0.0.
Anything else ends the episode with reward 0.0. After ``max_turns`` actions without an answer the
episode is truncated with reward 0.0.
"""

from __future__ import annotations

import random
import re

from zeromismatch.envs.arithmetic import parse_integer_answer
from zeromismatch.envs.base import Env, StepResult, Task
from zeromismatch.envs.safe_eval import UnsafeExpressionError, safe_eval

__all__ = ["ToolsEnv"]

MAX_OPERAND = 3981
_CALL = re.compile(r"\s*<calc>(.*?)</calc>\s*", re.DOTALL)
_ANSWER = re.compile(r"\s*<answer>.*?</answer>\s*", re.DOTALL)


class ToolsEnv(Env):
    name = "tools"

    def __init__(self, max_turns: int = 4, max_operand: int = 999) -> None:
        super().__init__()
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2 (one tool call and one answer), got {max_turns}")
        # the a**k % m template (k <= 5) must stay inside safe_eval's magnitude limit, or task
        # generation itself would be refused: 3981**5 < 1e18 <= 3982**5
        if not 10 <= max_operand <= MAX_OPERAND:
            raise ValueError(f"max_operand must be in 10..{MAX_OPERAND}, got {max_operand}")
        self.max_turns = max_turns
        self.max_operand = max_operand

    def _make_task(self, rng: random.Random) -> Task:
        a, b, c = (rng.randint(10, self.max_operand) for _ in range(3))
        template = rng.choice(("{a}*{b}+{c}", "({a}+{b})*{c}", "{a}*{b}-{c}", "{a}**{k}%{m}"))
        expression = template.format(a=a, b=b, c=c, k=rng.randint(2, 5), m=rng.randint(11, 97))
        return Task(
            prompt=f"Q: {expression}=\n", answer=safe_eval(expression), data={"expression": expression}
        )

    def _step(self, task: Task, action: str) -> StepResult:
        call = _CALL.fullmatch(action)
        if call:
            try:
                value = safe_eval(call.group(1))
            except UnsafeExpressionError as exc:
                return StepResult(
                    observation=f"<error>{exc}</error>\n",
                    reward=0.0,
                    done=False,
                    info={"tool_error": str(exc)},
                )
            return StepResult(
                observation=f"<result>{value}</result>\n", reward=0.0, done=False, info={"tool_result": value}
            )
        if _ANSWER.fullmatch(action):
            stated = parse_integer_answer(action)
            reward = 1.0 if stated is not None and stated == task.answer else 0.0
            return StepResult(observation="", reward=reward, done=True, info={"parsed": stated})
        return StepResult(
            observation="",
            reward=0.0,
            done=True,
            info={"error": "action is neither <calc>...</calc> nor <answer>...</answer>"},
        )

    def _demonstrate(self, task: Task) -> list[str]:
        return [f"<calc>{task.data['expression']}</calc>", f"<answer>{task.answer}</answer>"]
