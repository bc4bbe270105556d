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


def test_least_significant_digit_first_answers():
    env = ArithmeticEnv(max_digits=2, ops="+-", answer_order="lsd")
    for seed in range(40):
        env.reset(seed)
        task = env.current_task
        a, b, op = task.data["a"], task.data["b"], task.data["op"]
        assert task.prompt == f"Q: {a}{op}{b}=\nA reversed: "
        text = str(task.answer)
        sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
        written = sign + digits[::-1]
        assert env.score(f" {written}\n") == 1.0
        env.reset(seed)
        assert env.score(f"<answer>{written}</answer>") == 1.0
        if written != text:  # the usual order is wrong unless the answer is a palindrome
            env.reset(seed)
            assert env.score(text) == 0.0


def test_least_significant_digit_first_keeps_leading_zeros():
    env = ArithmeticEnv(max_digits=2, ops="+", answer_order="lsd")
    seed = next(s for s in range(500) if env.task(s).answer % 10 == 0 and env.task(s).answer >= 10)
    task = env.task(seed)
    env.reset(seed)
    assert env.score(str(task.answer)[::-1]) == 1.0  # "03" for 30
    env.reset(seed)
    assert env.score(str(int(str(task.answer)[::-1]))) == 0.0  # "3" drops a digit
    env.reset(seed)
    assert env.score("") == 0.0


def test_demonstrations_follow_the_answer_order():
    for order in ("msd", "lsd"):
        env = ArithmeticEnv(max_digits=2, ops="+", answer_order=order)
        demos = env.demonstrations(20)  # replayed through step(): raises unless every one earns reward 1
        assert len(demos) == 20


def test_unknown_answer_order_is_one_clear_error():
    with pytest.raises(ValueError, match="answer_order must be one of"):
        ArithmeticEnv(answer_order="reversed")


@pytest.mark.parametrize("ops", ["+", "*", "-"])
def test_a_commuted_twin_never_crosses_the_split(ops):
    # keyed by prompt, 73 of 128 held-out "b+a" tasks had their twin "a+b" (same answer) in training
    env = ArithmeticEnv(max_digits=2, ops=ops)
    train = {(t.data["a"], t.data["b"]) for t in (env.task(seed, "train") for seed in range(3000))}
    held_out = [env.task(seed, "eval") for seed in range(300)]
    twins = [(t.data["b"], t.data["a"]) in train for t in held_out if t.data["a"] != t.data["b"]]
    if ops == "-":  # a-b and b-a are different facts: both splits hold twins
        assert any(twins)
    else:
        assert twins and not any(twins)
