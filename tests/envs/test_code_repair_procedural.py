"""Procedural code repair: names and constants drawn per task, the fix a one-slot edit of a prompt line,
held-out identifier sets never in a training answer; the default variant untouched."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest

from zeromismatch.envs import CodeRepairEnv, default_tokenizer, make_env
from zeromismatch.envs.code_repair_procedural import BY_NAME, PROCEDURAL_TEMPLATES, identifier_key

_FIX = re.compile(r"<fix>(\d+)\|(.*)</fix>")


def _env(**options) -> CodeRepairEnv:
    return make_env("code_repair", procedural=True, **options)


def _fix_and_line(task, action):
    number, text = _FIX.fullmatch(action).groups()
    line = task.prompt.splitlines()[int(number)]  # line 0 is the issue
    assert line.startswith(f"{number}|")
    return int(number), text, line.split("|", 1)[1]


def test_same_seed_same_task_and_seeds_vary():
    first, second = _env(), _env()
    for split in ("train", "eval"):
        for seed in range(30):
            assert first.task(seed, split) == second.task(seed, split)
            task = first.task(seed, split)
            assert first._demonstrate(task) == second._demonstrate(second.task(seed, split))
    assert len({first.task(seed).prompt for seed in range(50)}) == 50
    assert first.task(0).prompt != CodeRepairEnv().task(0).prompt


def test_tasks_do_not_depend_on_the_process_hash_seed():
    script = (
        "from zeromismatch.envs import make_env\n"
        "env = make_env('code_repair', procedural=True)\n"
        "print(repr([(env.task(s, sp).prompt, env.split_key(env.task(s, sp)))"
        " for sp in ('train', 'eval') for s in range(10)]))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
        for hash_seed in ("1", "2")
    }
    assert len(outputs) == 1


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_demonstration_solves_its_task(split):
    env = _env()
    demos = env.demonstrations(300, seed=0, split=split)  # raises unless each earns reward 1 and solves
    assert len(demos) == 300
    tokenizer = default_tokenizer()
    for demo in demos:
        text = demo.prompt + demo.response
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert len(tokenizer.encode(demo.prompt)) <= 160  # short prompts: ~115 tokens on average
        assert 10 <= len(tokenizer.encode(demo.response)) <= 40


def test_the_fix_is_the_buggy_line_with_one_slot_edited():
    env = _env()
    for split in ("train", "eval"):
        for seed in range(300):
            task = env.task(seed, split)
            template = BY_NAME[task.data["template"]]
            buggy, correct = task.data["buggy"], task.data["correct"]
            differing = [slot for slot in correct if buggy[slot] != correct[slot]]
            assert differing == [task.data["bug_slot"]]
            number, text, line = _fix_and_line(task, env._demonstrate(task)[0])
            assert differing[0] in template.slots_of_line(number - 1)
            assert text != line
            # outside one short span (the slot's value) the fix is the prompt line character for character,
            # indentation included, and the span names no identifier
            prefix = len(os.path.commonprefix([text, line]))
            suffix = len(os.path.commonprefix([text[prefix:][::-1], line[prefix:][::-1]]))
            new, old = text[prefix : len(text) - suffix], line[prefix : len(line) - suffix]
            assert len(new) <= 2 and len(old) <= 2 and not re.search(r"[A-Za-z]", new + old), (text, line)
            assert text == template.render_line(number - 1, task.data["names"], correct)
            assert line == template.render_line(number - 1, task.data["names"], buggy)


def test_the_issue_states_the_constant_and_the_names():
    env = _env()
    for seed in range(200):
        task = env.task(seed)
        issue = task.prompt.splitlines()[0]
        names = task.data["names"]
        assert issue.startswith(f"Issue: {names['F']}(")
        template = BY_NAME[task.data["template"]]
        for slot in template.constant_slots:
            assert re.search(rf"\b{task.data['correct'][slot]}\b", issue)


def test_no_held_out_identifier_set_is_in_training():
    # the guarantee tested: over the first 20000 train tasks not one split key (the fix line's identifier
    # set) is an eval key, and so no eval answer string, nor any other edit solving an eval task, is a
    # training target
    env = _env()
    train_keys, train_targets = set(), set()
    for seed in range(20_000):
        task = env.task(seed, "train")
        fix = env._demonstrate(task)[0]
        train_keys.add(env.split_key(task))
        train_targets.add(fix)
    eval_keys, solving = set(), set()
    for seed in range(500):
        task = env.task(seed, "eval")
        key = env.split_key(task)
        assert env.split_of_key(key) == "eval"
        eval_keys.add(key)
        number, _, _ = _fix_and_line(task, env._demonstrate(task)[0])
        for text in env.candidate_edits(task, number):
            env.reset(seed, "eval")
            if env.step(f"<fix>{number}|{text}</fix>").solved:
                solving.add(f"<fix>{number}|{text}</fix>")
                assert identifier_key(f"<fix>{number}|{text}</fix>") == key
    assert len(eval_keys) >= 30 and not eval_keys & train_keys
    assert solving and not {_strip(fix) for fix in solving} & {_strip(fix) for fix in train_targets}


def _strip(fix: str) -> str:
    number, text = _FIX.fullmatch(fix).groups()
    return f"{number}|{text.strip()}"  # the env ignores indentation


def test_every_repair_is_trained_and_the_eval_split_is_large():
    # held-out tasks ask for repairs training demonstrates, on other names: every (template, wording,
    # slot) is in both splits, and the eval split has far more distinct tasks than eval_size 64
    env = _env()
    kinds = {}
    for split, seeds in (("train", 3000), ("eval", 1000)):
        tasks = [env.task(seed, split) for seed in range(seeds)]
        kinds[split] = {(t.data["template"], t.data["wording"], t.data["bug_slot"]) for t in tasks}
        if split == "eval":
            assert len({t.prompt for t in tasks[:200]}) >= 190
    every = {(t.name, wording, slot) for t in PROCEDURAL_TEMPLATES for wording in t.variants
             for slot in t.domains}  # fmt: skip
    assert kinds["train"] == kinds["eval"] == every


def test_candidate_edits_vary_only_that_lines_slots_and_wrong_text_is_not_run():
    env = _env(templates=("clamp",))
    task = env.task(0)
    names = task.data["names"]
    x = names["X"]
    edits = env.candidate_edits(task, 2)  # " if X {cmp} {k1}:"
    current = task.prompt.splitlines()[2].split("|", 1)[1].strip()
    assert len(edits) == 6 * 10 - 1 and current not in edits
    assert all(text.startswith(f"if {x} ") for text in edits)
    assert env.candidate_edits(task, 1) == {} and env.candidate_edits(task, 9) == {}
    actions = (f"<fix>2|if {x} > __import__('os').getpid():</fix>", f"<fix>1|def {names['F']}({x}):</fix>",
               f"<fix>2|{current}</fix>", "if x > 3:")  # fmt: skip
    for action in actions:
        env.reset(0)
        result = env.step(action)
        assert result.done and result.reward == 0.0 and "error" in result.info


def test_partial_credit_is_the_fraction_of_tests_passed():
    env = _env(templates=("fold",))
    for seed in range(30):
        task = env.task(seed)
        number = 4
        for text, assignment in env.candidate_edits(task, number).items():
            template = BY_NAME["fold"]
            passed = sum(template.run(assignment, args) == want for args, want in task.data["tests"])
            env.reset(seed)
            assert env.score(f"<fix>{number}|{text}</fix>") == passed / len(task.data["tests"])


def test_templates_option_selects_procedural_templates():
    for name in BY_NAME:
        env = _env(templates=(name,))
        drawn = {env.task(seed, split).data["template"] for seed in range(20) for split in ("train", "eval")}
        assert drawn == {name}
    assert _env(templates="count").template_names == ("count",)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"procedural": "yes"}, "procedural must be a bool"),
        ({"procedural": 1}, "procedural must be a bool"),
        ({"procedural": True, "templates": ("sum_range",)}, "unknown procedural templates"),
        ({"procedural": True, "templates": ()}, "unknown procedural templates"),
        ({"procedural": False, "templates": ("fold",)}, "unknown templates"),
        ({"procedural": True, "num_tests": 0}, "num_tests"),
        ({"procedural": True, "num_tests": 2.5}, "num_tests"),
    ],
)
def test_bad_options_give_one_clear_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        make_env("code_repair", **options)


# Captured from the default variant before the procedural one was added: its tasks, fixes and split are
# what the committed results were measured on.
_DEFAULT_TRAIN_7 = (
    "Fix the bug:\n1 def factorial(n):\n2     result = 1\n3     for i in range(1, n + 1):\n"
    "4         result = result + i\n5     return result\nTests:\nassert factorial(3) == 6\n"
    "assert factorial(0) == 1\nassert factorial(2) == 2\nassert factorial(0) == 1\n"
    "assert factorial(7) == 5040\nPatch: "
)
_DEFAULT_EVAL_3 = (
    "Fix the bug:\n1 def sum_range(n):\n2     total = 0\n3     for i in range(1, n + 1):\n"
    "4         total = total * i\n5     return total\nTests:\nassert sum_range(9) == 45\n"
    "assert sum_range(9) == 45\nassert sum_range(1) == 1\nassert sum_range(1) == 1\n"
    "assert sum_range(0) == 0\nPatch: "
)
_DEFAULT_FINGERPRINT = "6ad66b4f3a3870d58e59ad1018c4bf4e3316d2e915ab5e076108ee8f6431b5e3"


@pytest.mark.parametrize("options", [{}, {"procedural": False}])
def test_the_default_variant_is_unchanged(options):
    env = make_env("code_repair", **options)
    task = env.task(7, "train")
    assert (task.prompt, env._demonstrate(task)) == (_DEFAULT_TRAIN_7, ["<fix>4|result = result * i</fix>"])
    task = env.task(3, "eval")
    assert (task.prompt, env._demonstrate(task)) == (_DEFAULT_EVAL_3, ["<fix>4|total = total + i</fix>"])
    digest = hashlib.sha256()
    for split in ("train", "eval"):
        for seed in range(300):
            task = env.task(seed, split)
            digest.update(repr((task.prompt, env._demonstrate(task)[0], env.split_key(task))).encode())
    assert digest.hexdigest() == _DEFAULT_FINGERPRINT
