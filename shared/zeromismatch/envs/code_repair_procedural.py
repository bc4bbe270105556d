"""The procedural variant of code repair (``CodeRepairEnv(procedural=True)``): a repair *procedure*.

The default variant has one correct function per template, so its 14 fixes are fixed strings; keyed
by the fix, 4 are held out and never trained on, and a tiny model that memorises the other 10 scores 0
held out by construction. Here every task draws its own identifiers (a 3-letter function name,
one-letter variables) and constant, so the same fix never recurs as a string: what carries over from
training is the procedure. A prompt is an *issue* stating what the function should do (SWE-bench's
issue text; its tests stay hidden, as SWE-bench's are) and the numbered buggy function::

    Issue: kob(n) is the sum of 3..n
    1|def kob(n):
    2| t = 0
    3| for v in range(3, n + 1):
    4|  t = t * v
    5| return t
    Patch:

and the fix is a copy of the buggy prompt line, numbering and indentation included, with its one wrong
slot (an operator, a comparison, a constant, an off-by-one) set back: ``<fix>4|  t = t + v</fix>``. The
issue decides every slot: its wording the operators and comparisons ("sum" +, "product" *, "largest" >,
"above" >, "caps" > ...), its number the constant. Four templates with two wordings each:

- ``fold``: ``sum`` / ``product`` of ``K..n`` (slots: initial value, range start = K, range end, operator)
- ``extreme``: ``largest`` / ``smallest`` item (slots: initial index, comparison)
- ``count``: items ``above`` / ``below`` K (slots: initial count, comparison, the constant K, increment)
- ``clamp``: ``caps`` / ``floors`` x at K (slots: comparison, the constant K in the test and in the
  assignment)

A bug is drawn slot first, then value: a constant slot's is off by one (K - 1 or K + 1), any other
slot's any other value of its domain; either must fail at least one of the task's unit tests. Reward and
grading are the default variant's: the patch selects slot values from the line's table, this module's
interpreter runs them on the unit tests (reward = fraction passed) and on 200 hidden inputs per template
(``solved``: equal to the task's correct function on all). Nothing the model writes is executed.

Split, by held-out identifier sets: ``split_key`` is the set of identifiers the fixed line uses (``{t, v}``
above), so an identifier combination is either only ever in training answers or only ever in held-out
ones. Why this and not (template, slot) pairs: holding out a (template, slot) asks for a repair never
demonstrated in that template, a compositional jump (not measured here) of the kind that left the
default variant at 0; holding out identifier sets keeps every (template, wording, slot) repair in
training and asks held-out tasks to apply it to names never produced together in a training answer, so
held-out pass@1 measures copying the buggy line and changing the slot, not recall. Why not the whole
fix string: a held-out answer could then differ from a training answer by its constant or line number
alone. The guarantee: the key is a function of the fix text, and every patch that solves a task edits
slot values only (digits, operators, comparisons; never a name), so it uses the same identifiers as the
fix. Hence no string that solves an eval task (the demonstrated fix or an equivalent one, ``>=`` for
``>`` in ``caps``) is ever a training target.

Learnable: tiny-qwen3 after 600 SFT steps (batch 16, sft_lr 3e-3, seed 0) solves 0.56 of 64 held-out
tasks greedily (0.00 at 300 steps, 0.02 at 400, 0.25 at 500).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from zeromismatch.envs.repair_interpreter import ARITH, COMPARE, range_fold, run_tests

__all__ = ["PROCEDURAL_TEMPLATES", "ProceduralTemplate", "identifier_key"]

_DIGITS = tuple(string.digits)
_FIELD = string.Formatter()
_WORD = re.compile(r"[A-Za-z_]\w*")
#: words of the templates' code that are no identifiers drawn per task
_KEYWORDS = frozenset({"def", "for", "in", "range", "if", "return"})
_VARIABLES = tuple(string.ascii_lowercase)
_CONSONANTS, _VOWELS = "bcdfghjklmnpqrstvwxz", "aeiou"
#: consonant-vowel-consonant names that Python or the prompt already uses
_RESERVED = frozenset(
    {"def", "del", "for", "not", "bin", "dir", "hex", "len", "map", "max", "min", "pow", "set", "sum", "zip"}
)
_NAMES = tuple(
    name for name in (c1 + v + c2 for c1 in _CONSONANTS for v in _VOWELS for c2 in _CONSONANTS)
    if name not in _RESERVED
)  # fmt: skip
HIDDEN_TESTS = 200


@dataclass(frozen=True)
class ProceduralTemplate:
    name: str
    #: str.format templates; fields named in ``names`` are identifiers, the others slots
    lines: tuple[str, ...]
    names: tuple[str, ...]  # identifier fields: the first is the function name, the rest one-letter variables
    domains: dict[str, tuple[str, ...]]  # slot -> allowed values (as they appear in the text)
    constant_slots: tuple[str, ...]  # slots whose correct value is the task's constant K
    constants: tuple[int, int]  # K is drawn from this inclusive range
    #: wording -> (issue text, the correct value of every slot that is not a constant slot)
    variants: dict[str, tuple[str, dict[str, str]]]
    run: Callable[[dict[str, str], tuple], object]  # our interpreter: slot values x arguments -> result
    sample_args: Callable[[random.Random], tuple]

    def slots_of_line(self, index: int) -> list[str]:
        return [field for _, field, _, _ in _FIELD.parse(self.lines[index]) if field in self.domains]

    def render_line(self, index: int, names: dict[str, str], slots: dict[str, str]) -> str:
        return self.lines[index].format(**names, **slots)


def _extreme(slots: dict[str, str], args: tuple) -> int:
    (xs,) = args
    best = xs[int(slots["idx"])]
    for x in xs:
        if COMPARE[slots["cmp"]](x, best):
            best = x
    return best


def _count(slots: dict[str, str], args: tuple) -> int:
    (xs,) = args
    count = int(slots["init"])
    for x in xs:
        if COMPARE[slots["cmp"]](x, int(slots["k"])):
            count = count + int(slots["inc"])
    return count


def _clamp(slots: dict[str, str], args: tuple) -> int:
    (x,) = args
    if COMPARE[slots["cmp"]](x, int(slots["k1"])):
        x = int(slots["k2"])
    return x


def _list(rng: random.Random, low: int, high: int) -> tuple:
    return ([rng.randint(low, high) for _ in range(rng.randint(1, 6))],)


PROCEDURAL_TEMPLATES: tuple[ProceduralTemplate, ...] = (
    ProceduralTemplate(
        name="fold",
        lines=(
            "def {F}({N}):",
            " {T} = {init}",
            " for {V} in range({start}, {N} + {end}):",
            "  {T} = {T} {op} {V}",
            " return {T}",
        ),
        names=("F", "N", "T", "V"),
        domains={"init": ("0", "1"), "start": _DIGITS, "end": ("0", "1", "2"), "op": tuple(ARITH)},
        constant_slots=("start",),
        constants=(1, 5),
        variants={
            "sum": ("{F}({N}) is the sum of {K}..{N}", {"init": "0", "end": "1", "op": "+"}),
            "product": ("{F}({N}) is the product of {K}..{N}", {"init": "1", "end": "1", "op": "*"}),
        },
        run=lambda slots, args: range_fold(slots, args, "init"),
        sample_args=lambda rng: (rng.randint(0, 9),),
    ),
    ProceduralTemplate(
        name="extreme",
        lines=(
            "def {F}({A}):",
            " {B} = {A}[{idx}]",
            " for {X} in {A}:",
            "  if {X} {cmp} {B}:",
            "   {B} = {X}",
            " return {B}",
        ),
        names=("F", "A", "B", "X"),
        domains={"idx": ("0", "1", "-1"), "cmp": tuple(COMPARE)},
        constant_slots=(),
        constants=(0, 0),
        variants={
            "largest": ("{F}({A}) is the largest item of {A}", {"idx": "0", "cmp": ">"}),
            "smallest": ("{F}({A}) is the smallest item of {A}", {"idx": "0", "cmp": "<"}),
        },
        run=_extreme,
        sample_args=lambda rng: _list(rng, -9, 9),
    ),
    ProceduralTemplate(
        name="count",
        lines=(
            "def {F}({A}):",
            " {C} = {init}",
            " for {X} in {A}:",
            "  if {X} {cmp} {k}:",
            "   {C} = {C} + {inc}",
            " return {C}",
        ),
        names=("F", "A", "C", "X"),
        domains={"init": ("0", "1"), "cmp": tuple(COMPARE), "k": _DIGITS, "inc": ("0", "1", "2")},
        constant_slots=("k",),
        constants=(1, 8),
        variants={
            "above": ("{F}({A}) counts items above {K}", {"init": "0", "cmp": ">", "inc": "1"}),
            "below": ("{F}({A}) counts items below {K}", {"init": "0", "cmp": "<", "inc": "1"}),
        },
        run=_count,
        sample_args=lambda rng: _list(rng, 0, 9),
    ),
    ProceduralTemplate(
        name="clamp",
        lines=("def {F}({X}):", " if {X} {cmp} {k1}:", "  {X} = {k2}", " return {X}"),
        names=("F", "X"),
        domains={"cmp": tuple(COMPARE), "k1": _DIGITS, "k2": _DIGITS},
        constant_slots=("k1", "k2"),
        constants=(1, 8),
        variants={
            "caps": ("{F}({X}) caps {X} at {K}", {"cmp": ">"}),
            "floors": ("{F}({X}) floors {X} at {K}", {"cmp": "<"}),
        },
        run=_clamp,
        sample_args=lambda rng: (rng.randint(-1, 10),),
    ),
)
BY_NAME = {template.name: template for template in PROCEDURAL_TEMPLATES}


@functools.cache
def _hidden_inputs(name: str) -> tuple[tuple, ...]:
    rng = random.Random(f"code_repair/procedural/hidden/{name}")
    return tuple(BY_NAME[name].sample_args(rng) for _ in range(HIDDEN_TESTS))


def equivalent(template: ProceduralTemplate, slots: dict[str, str], correct: dict[str, str]) -> bool:
    """Whether ``slots`` computes the task's correct function on the template's hidden inputs."""
    for args in _hidden_inputs(template.name):
        try:
            if template.run(slots, args) != template.run(correct, args):
                return False
        except (IndexError, ZeroDivisionError, OverflowError):
            return False
    return True


def make_task_parts(
    template: ProceduralTemplate, rng: random.Random, num_tests: int
) -> tuple[str, dict] | None:
    """(prompt, task data) of one task drawn with ``rng``; None when the drawn tests tell no bug apart."""
    wording = rng.choice(sorted(template.variants))
    issue, fixed = template.variants[wording]
    constant = rng.randint(*template.constants)
    correct = {**fixed, **{slot: str(constant) for slot in template.constant_slots}}
    variables = rng.sample(_VARIABLES, len(template.names) - 1)
    names = dict(zip(template.names, (rng.choice(_NAMES), *variables)))
    tests = []
    for _ in range(num_tests):
        args = template.sample_args(rng)
        tests.append((args, template.run(correct, args)))
    bugs: dict[str, list[str]] = {}
    for slot, values in template.domains.items():
        if slot in template.constant_slots:
            values = tuple(str(value) for value in (constant - 1, constant + 1))
        wrong = [value for value in values if value != correct[slot]
                 and run_tests(template, {**correct, slot: value}, tests) < len(tests)]  # fmt: skip
        if wrong:
            bugs[slot] = wrong
    if not bugs:
        return None
    # the slot first, then its wrong value: drawn from all (slot, value) pairs alike, 5 of 6 bugs of the
    # 6-way comparisons would be comparison bugs and the other slots' repairs rarely demonstrated
    slot = rng.choice(sorted(bugs))
    value = rng.choice(bugs[slot])
    buggy = {**correct, slot: value}
    numbered = "\n".join(
        f"{index + 1}|{template.render_line(index, names, buggy)}" for index in range(len(template.lines))
    )
    prompt = f"Issue: {issue.format(**names, K=constant)}\n{numbered}\nPatch: "
    data = {"template": template.name, "procedural": True, "wording": wording, "names": names,
            "buggy": buggy, "correct": correct, "tests": tests, "bug_slot": slot}  # fmt: skip
    return prompt, data


def bug_line(template: ProceduralTemplate, slot: str) -> int:
    """The 0-based index of the line holding ``slot``."""
    return next(i for i in range(len(template.lines)) if slot in template.slots_of_line(i))


def fix_action(template: ProceduralTemplate, data: dict) -> str:
    """The correct patch: the buggy prompt line, copied with its wrong slot set to the correct value."""
    index = bug_line(template, data["bug_slot"])
    return f"<fix>{index + 1}|{template.render_line(index, data['names'], data['correct'])}</fix>"


def identifier_key(fix: str) -> str:
    """The split key of fix action ``fix``: the sorted identifiers its new line uses."""
    text = fix.split("|", 1)[1].removesuffix("</fix>")
    return "identifiers:" + ",".join(sorted(set(_WORD.findall(text)) - _KEYWORDS))


def candidate_edits(template: ProceduralTemplate, data: dict, line_number: int) -> dict[str, dict[str, str]]:
    """Every allowed new text of a line (stripped) -> the full slot assignment it stands for."""
    index = line_number - 1
    if not 0 <= index < len(template.lines):
        return {}
    slots = template.slots_of_line(index)
    table = {}
    for values in itertools.product(*(template.domains[slot] for slot in slots)):
        assignment = {**data["buggy"], **dict(zip(slots, values))}
        if assignment != data["buggy"]:  # the line as it stands is no edit
            table[template.render_line(index, data["names"], assignment).strip()] = assignment
    return table
