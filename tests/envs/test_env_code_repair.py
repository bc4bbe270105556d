"""Code-repair env: injected bugs fail tests, the right patch passes all, arbitrary text never runs."""

from __future__ import annotations

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
        assignment = env.candidate_edits(task, 3)[text]
        expected = run_tests(template, assignment, task.data["tests"]) / len(task.data["tests"])
        result = env.step(f"<fix>3|    {text}</fix>")
        assert result.done and result.reward == expected


def test_candidate_edits_only_vary_the_slots_of_that_line():
    env = CodeRepairEnv(templates=("abs_diff",))
    task = env.task(0)
    edits = env.candidate_edits(task, 2)
    assert set(edits) == {f"if a {cmp} b:" for cmp in (">", "<", ">=", "<=", "==", "!=")}
    assert env.candidate_edits(task, 1) == {"def abs_diff(a, b):": task.data["buggy"]}
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
