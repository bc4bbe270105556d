"""Arithmetic reasoning env (the AIME-style stand-in; eval metric pass@1 = mean reward).

Task: ``a op b`` with op in {+, -, *}; addition/subtraction operands have 1..``max_digits`` digits,
multiplication operands 1..``max_mul_digits`` digits. Prompt ``"Q: 37+48=\nA: "``. Single turn.
Reward 1.0 iff the response, with surrounding whitespace removed, is a decimal integer equal to the
answer (optionally wrapped in ``<answer>...</answer>``; leading zeros and "-0" are read as ``int`` reads
them); otherwise 0.0. No partial credit, no tolerance: the reward is verifiable.

``answer_order="lsd"`` asks for the answer's digits least-significant first (sign in front, leading
zeros of the reversed form kept: 12+18=30 is answered ``03``), prompted ``"Q: 37+48=\nA reversed: "``.
Writing the units digit first puts each carry before the digit that needs it, which is what lets a
2-layer model learn multi-digit addition as a rule within CPU minutes instead of memorising facts
(Lee et al. 2023, "Teaching Arithmetic to Small Transformers"). The default ``"msd"`` is the usual
order.
"""

from __future__ import annotations

import random
import re

from zeromismatch.envs.base import Env, StepResult, Task

__all__ = ["ArithmeticEnv"]

ANSWER_ORDERS = ("msd", "lsd")
_INTEGER = re.compile(r"-?\d{1,40}")
_WRAPPED = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def stated_text(response: str) -> str:
    """What a response states: the text, stripped, or what an ``<answer>...</answer>`` wrapper holds."""
    text = response.strip()
    wrapped = _WRAPPED.fullmatch(text)
    return wrapped.group(1) if wrapped else text


def parse_integer_answer(response: str) -> int | None:
    """The integer a response states, or None. Accepts "85" or "<answer>85</answer>"; like ``int``, also
    leading zeros and "-0" ("085" states 85), so the reward checks the value, not its spelling."""
    text = stated_text(response)
    return int(text) if _INTEGER.fullmatch(text) else None


class ArithmeticEnv(Env):
    name = "arithmetic"
    max_turns = 1

    def __init__(
        self, max_digits: int = 2, max_mul_digits: int = 1, ops: str = "+-*", answer_order: str = "msd"
    ) -> None:
        super().__init__()
        if answer_order not in ANSWER_ORDERS:
            raise ValueError(f"answer_order must be one of {ANSWER_ORDERS}, got {answer_order!r}")
        if not 1 <= max_digits <= 9 or not 1 <= max_mul_digits <= 9:
            raise ValueError(f"digits must be in 1..9, got max_digits={max_digits}, max_mul={max_mul_digits}")
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
        self.max_digits = max_digits
        self.max_mul_digits = max_mul_digits
        self.ops = ops
        self.answer_order = answer_order

    def _operand(self, rng: random.Random, digits: int) -> int:
        length = rng.randint(1, digits)
        return rng.randint(0 if length == 1 else 10 ** (length - 1), 10**length - 1)

    def _make_task(self, rng: random.Random) -> Task:
        op = rng.choice(self.ops)
        digits = self.max_mul_digits if op == "*" else self.max_digits
        a, b = self._operand(rng, digits), self._operand(rng, digits)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        if self.answer_order == "lsd":
            prompt = f"Q: {a}{op}{b}=\nA reversed: "
        else:
            prompt = f"Q: {a}{op}{b}=\nA: "
        return Task(prompt=prompt, answer=answer, data={"a": a, "b": b, "op": op})

    def split_key(self, task: Task) -> str:
        # a+b and b+a (a*b, b*a) are one fact: the operands unordered for the commutative ops
        a, b, op = task.data["a"], task.data["b"], task.data["op"]
        if op in "+*":
            a, b = sorted((a, b))
        return f"{a}{op}{b}"

    def _written(self, answer: int) -> str:
        text = str(answer)
        if self.answer_order == "lsd":
            sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
            text = sign + digits[::-1]
        return text

    def _step(self, task: Task, action: str) -> StepResult:
        if self.answer_order == "lsd":
            # the reversed form is compared as text: its leading zeros are digits of the answer
            stated = stated_text(action) or None
            reward = 1.0 if stated == self._written(task.answer) else 0.0
        else:
            stated = parse_integer_answer(action)
            reward = 1.0 if stated is not None and stated == task.answer else 0.0
        return StepResult(observation="", reward=reward, done=True, info={"parsed": stated})

    def _demonstrate(self, task: Task) -> list[str]:
        return [self._written(task.answer)]
