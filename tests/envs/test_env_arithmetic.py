"""Arithmetic env: exact-answer reward, answer parsing, configuration errors."""

from __future__ import annotations

import pytest

from zeromismatch.envs import ArithmeticEnv
from zeromismatch.envs.arithmetic import parse_integer_answer


def test_reward_is_exact_match_of_the_answer():
    env = ArithmeticEnv()
    for seed in range(30):
        env.reset(seed)
        task = env.current_task
        a, b, op = task.data["a"], task.data["b"], task.data["op"]
        assert task.prompt == f"Q: {a}{op}{b}=\nA: "
        assert task.answer == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert env.score(f"  {task.answer}\n") == 1.0
        env.reset(seed)
        assert env.score(f"<answer>{task.answer}</answer>") == 1.0
        env.reset(seed)
        assert env.score(str(task.answer + 1)) == 0.0


def test_parse_integer_answer():
    assert parse_integer_answer("85") == 85
    assert parse_integer_answer(" -12 ") == -12
    assert parse_integer_answer("<answer> 7 </answer>") == 7
    assert parse_integer_answer("85 apples") is None
    assert parse_integer_answer("8.5") is None
    assert parse_integer_answer("") is None


def test_operand_ranges_respect_configuration():
    env = ArithmeticEnv(max_digits=3, max_mul_digits=2, ops="*")
    for seed in range(50):
        data = env.task(seed).data
        assert data["op"] == "*" and 0 <= data["a"] <= 99 and 0 <= data["b"] <= 99


def test_bad_configuration():
    with pytest.raises(ValueError, match="ops"):
        ArithmeticEnv(ops="/")
    with pytest.raises(ValueError, match="digits"):
        ArithmeticEnv(max_digits=0)
