"""Code-repair env: injected bugs fail tests, the right patch passes all, arbitrary text never runs."""

from __future__ import annotations

import random

import pytest

from zeromismatch.envs import CodeRepairEnv
from zeromismatch.envs.code_repair import TEMPLATES, run_tests


def test_every_template_reference_passes_its_tests_and_the_bug_does_not():
    env = CodeRepairEnv()
    seen = set()
    for seed in range(80):
        task = env.task(seed)
        template = next(t for t in TEMPLATES if t.name == task.data["template"])
        tests = task.data["tests"]
        seen.add(template.name)
        assert run_tests(template, template.correct, tests) == len(tests)
        assert run_tests(template, task.data["buggy"], tests) < len(tests)
    assert seen == {t.name for t in TEMPLATES}


def test_partial_credit_is_the_fraction_of_tests_passed():
    env = CodeRepairEnv(templates=("sum_range",))
    for seed in range(40):
        env.reset(seed)
        task = env.current_task
        template = TEMPLATES[0]
        # rewrite the loop line with a deliberately wrong range end; reward = passed / total
        text = "for i in range(1, n + 2):"
        if text not in env.candidate_edits(task, 3):  # the line already reads so: no edit
            continue
        assignment = env.candidate_edits(task, 3)[text]
        expected = run_tests(template, assignment, task.data["tests"]) / len(task.data["tests"])
        result = env.step(f"<fix>3|    {text}</fix>")
        assert result.done and result.reward == expected


def test_candidate_edits_only_vary_the_slots_of_that_line():
    env = CodeRepairEnv(templates=("abs_diff",))
    task = env.task(0)
    edits = env.candidate_edits(task, 2)
    current = env.task(0).prompt.splitlines()[2].split(" ", 1)[1].strip()  # numbered line 2 as shown
    every = {f"if a {cmp} b:" for cmp in (">", "<", ">=", "<=", "==", "!=")}
    assert set(edits) == every - {current}  # the line as it stands is no edit
    assert env.candidate_edits(task, 1) == {}  # a line without slots cannot be edited
    assert env.candidate_edits(task, 99) == {}


@pytest.mark.parametrize(
    "action",
    [
        "<fix>3|for i in range(1, __import__('os').getpid()):</fix>",
        "<fix>2|total = 0; import os</fix>",
        "<fix>9|return 0</fix>",
        "total = 0",
        "<fix>x|total = 0</fix>",
    ],
)
def test_text_outside_the_edit_table_is_rejected_not_run(action):
    env = CodeRepairEnv(templates=("sum_range",))
    env.reset(0)
    result = env.step(action)
    assert result.done and result.reward == 0.0 and "error" in result.info


def test_bad_configuration():
    with pytest.raises(ValueError, match="unknown templates"):
        CodeRepairEnv(templates=("quicksort",))
    with pytest.raises(ValueError, match="num_tests"):
        CodeRepairEnv(num_tests=0)


def test_a_line_as_it_stands_is_no_edit():
    # session 7 review: copying a prompt line (e.g. the slot-free "def ...:" line) was an "allowed
    # edit" and scored the buggy function's own pass rate, 0.19 on average over train tasks
    env = CodeRepairEnv()
    for seed in range(60):
        env.reset(seed, "train")
        task = env.current_task
        template = next(t for t in TEMPLATES if t.name == task.data["template"])
        buggy_lines = template.render(task.data["buggy"])
        for number, line in enumerate(buggy_lines, start=1):
            assert line.strip() not in env.candidate_edits(task, number)
            env.reset(seed, "train")
            assert env.score(f"<fix>{number}|{line}</fix>") == 0.0
        env.reset(seed, "train")
        assert env.score(env._demonstrate(env.current_task)[0]) == 1.0  # the real fix still scores


def test_a_held_out_buggy_function_never_appears_in_training():
    # keyed by prompt, every held-out buggy function (which alone decides the fix) was a training task
    # shown with other unit tests, so a lookup table memorised from training scored 1.0 held out
    env = CodeRepairEnv()

    def function(task):
        return task.prompt.split("\nTests:")[0]

    train = {function(env.task(seed, "train")) for seed in range(1000)}
    held_out = {function(env.task(seed, "eval")) for seed in range(200)}
    assert len(held_out) >= 3 and not train & held_out


def test_no_held_out_fix_is_a_training_target():
    # keyed by the buggy function, 46 of 64 held-out tasks had their exact fix (a template has one correct
    # function, and two templates share a fixed line) among the training targets
    env = CodeRepairEnv()
    train = {env._demonstrate(env.task(seed, "train"))[0] for seed in range(1000)}
    held_out = {env._demonstrate(env.task(seed, "eval"))[0] for seed in range(200)}
    assert held_out and not train & held_out


def test_a_patch_passing_the_visible_tests_but_not_the_function_is_not_solved():
    env = CodeRepairEnv()
    found = 0
    for seed in range(300):
        task = env.task(seed)
        for line in range(1, 7):
            for text, assignment in env.candidate_edits(task, line).items():
                template = next(t for t in TEMPLATES if t.name == task.data["template"])
                if run_tests(template, assignment, task.data["tests"]) != len(task.data["tests"]):
                    continue
                env.reset(seed)
                result = env.step(f"<fix>{line}|{text}</fix>")
                assert result.reward == 1.0
                inputs = [template.sample_args(random.Random(i)) for i in range(300)]
                wrong = not all(_agrees(template, assignment, args) for args in inputs)
                assert result.solved == (not wrong), (seed, line, text)
                found += wrong
    assert found  # weak visible tests do let wrong patches through: the case this grading exists for


def _agrees(template, assignment, args) -> bool:
    try:
        return template.run(assignment, args) == template.run(template.correct, args)
    except (IndexError, ZeroDivisionError, OverflowError):
        return False
