"""Multi-step desktop env: screens, actions, a goal state, and injectable step latency (OSWorld stand-in).

A state machine of screens. ``desktop`` -> (``open menu``) -> ``menu`` -> (``select APP``) -> an app
screen with fields; on an app screen ``type FIELD=VALUE`` sets a field, ``back`` returns to the menu
(fields reset when an app is reopened), ``submit`` ends the episode. The task names an app and the values
some of its fields must hold; reward 1.0 iff ``submit`` is pressed in that app with those values, else 0.0
(also 0.0 on truncation after ``max_turns`` actions).

Each action is ``<act>ACTION</act>``; the env answers ``<obs>SCREEN; actions: ...</obs>\n`` (or an error
observation for an action the screen does not offer -- the step is spent, the episode continues).

``restate_goal=True`` repeats the goal's field values at the end of every app-screen observation
(``; goal: to=dave subject=trip``), the way an agent harness re-shows the instruction with each
screenshot: the value to type is then a few tokens back instead of at the top of the transcript. A
2-layer character model trained 600 SFT steps on the plain env still typed wrong values on held-out
tasks (``volume=10`` for ``volume=17``); see docs/learnability.md.

``free_text=True`` makes mail's ``to`` and ``subject`` free text: each task draws them as random
lowercase words of 3-6 letters (any 1-8 letters are valid to type). With the fixed value sets there are
about 1,100 distinct tasks, so a few hundred SFT steps demonstrate every train task many times and the
policy can answer train tasks from memory; RL then raises train reward without raising held-out pass@1
(docs/learnability.md). Free text makes the mail tasks (about a third) unique, so for them the only way
to a reward is to copy the values from the task, the same skill on train and held-out tasks; settings
and calendar tasks keep their fixed value sets and still repeat (2,000 train draws: 1,058 distinct).

``step_latency_s`` sleeps inside every step to model the seconds an OSWorld step takes (S3 reports mean
step times of 944.25 s aligned vs 884.17 s standard); the measured sleep is reported in ``info``.
"""

from __future__ import annotations

import random
import re
import time

from zeromismatch.envs.base import Env, StepResult, Task

__all__ = ["APPS", "DesktopEnv"]

# Value sets are wide on purpose: with a few hundred distinct tasks a tiny policy memorises each
# train task's answer instead of learning to copy field values from the prompt, and held-out tasks
# (new combinations) stay unsolved (docs/learnability.md). ``type FIELD=VALUE`` is written the way the task
# states the goal (``to=dave``), so copying a value is matching the text before it, not translating it.
_NAMES = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "ken", "lena",
    "mia", "nick", "olga", "paul", "quinn", "rosa", "sam", "tina", "uma", "victor", "wendy", "xena",
)  # fmt: skip
_SUBJECTS = (
    "lunch", "report", "budget", "trip", "notes", "plan", "invoice", "draft", "review", "party", "demo",
    "offer", "ticket", "memo", "agenda", "photos", "slides", "update", "visit", "order", "rent", "quiz",
)  # fmt: skip
APPS: dict[str, dict[str, tuple[str, ...]]] = {
    "settings": {"volume": tuple(str(v) for v in range(101)), "theme": ("light", "dark")},
    "mail": {"to": _NAMES, "subject": _SUBJECTS},
    "calendar": {"day": ("mon", "tue", "wed", "thu", "fri", "sat", "sun"),
                 "hour": tuple(str(h) for h in range(24))},
}  # fmt: skip
_ACT = re.compile(r"\s*<act>(.*?)</act>\s*", re.DOTALL)
_FREE_TEXT_FIELDS = frozenset({"to", "subject"})
_FREE_TEXT = re.compile(r"[a-z]{1,8}")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class DesktopEnv(Env):
    name = "desktop"

    def __init__(
        self,
        max_turns: int = 10,
        step_latency_s: float = 0.0,
        restate_goal: bool = False,
        list_actions: bool = True,
        free_text: bool = False,
    ) -> None:
        super().__init__()
        # a goal sets up to every field of its app: open, select, one type per field, submit
        most_actions = 3 + max(len(fields) for fields in APPS.values())
        if max_turns < most_actions:
            raise ValueError(
                f"max_turns must be >= {most_actions} (open, select, type each field, submit), "
                f"got {max_turns}"
            )
        if not 0.0 <= step_latency_s <= 3600.0:
            raise ValueError(f"step_latency_s must be in [0, 3600], got {step_latency_s}")
        self.max_turns = max_turns
        self.step_latency_s = float(step_latency_s)
        self.restate_goal = bool(restate_goal)
        self.list_actions = bool(list_actions)
        self.free_text = bool(free_text)
        self._goal_text = ""
        self._screen = "desktop"
        self._fields: dict[str, str] = {}

    def _make_task(self, rng: random.Random) -> Task:
        app = rng.choice(sorted(APPS))
        names = sorted(APPS[app])
        chosen = sorted(rng.sample(names, rng.randint(1, len(names))))
        goal = {field: self._draw_value(rng, app, field) for field in chosen}
        wanted = " ".join(f"{field}={value}" for field, value in goal.items())
        prompt = f"Task: in {app} set {wanted} then submit.\n{self._observe('desktop')}"
        return Task(prompt=prompt, answer={"app": app, "fields": goal})

    def _draw_value(self, rng: random.Random, app: str, field: str) -> str:
        if self.free_text and field in _FREE_TEXT_FIELDS:
            return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 6)))
        return rng.choice(APPS[app][field])

    def _valid_value(self, field: str, value: str) -> bool:
        if self.free_text and field in _FREE_TEXT_FIELDS:
            return _FREE_TEXT.fullmatch(value) is not None
        return value in APPS[self._screen][field]

    def _reset_state(self, task: Task) -> None:
        self._screen = "desktop"
        self._fields = {}
        self._goal_text = " ".join(f"{field}={value}" for field, value in task.answer["fields"].items())

    @staticmethod
    def _actions(screen: str) -> list[str]:
        if screen == "desktop":
            return ["open menu"]
        if screen == "menu":
            return [f"select {app}" for app in sorted(APPS)] + ["close"]
        return [f"type {field}=VALUE" for field in sorted(APPS[screen])] + ["back", "submit"]

    def _observe(self, screen: str, fields: dict[str, str] | None = None, error: str = "") -> str:
        shown = screen
        if fields:
            shown += " " + " ".join(f"{name}={value}" for name, value in sorted(fields.items()))
        prefix = f"error: {error}; " if error else ""
        goal = f"; goal: {self._goal_text}" if self.restate_goal and screen in APPS else ""
        actions = f"; actions: {', '.join(self._actions(screen))}" if self.list_actions else ""
        return f"<obs>{prefix}{shown}{actions}{goal}</obs>\n"

    def _step(self, task: Task, action: str) -> StepResult:
        started = time.perf_counter()
        if self.step_latency_s > 0:
            time.sleep(self.step_latency_s)
        result = self._transition(task, action)
        info = dict(result.info, latency_s=time.perf_counter() - started)
        return StepResult(result.observation, result.reward, result.done, info)

    def _transition(self, task: Task, action: str) -> StepResult:
        match = _ACT.fullmatch(action)
        if not match:
            return StepResult("", 0.0, True, {"error": "action is not <act>...</act>"})
        command = match.group(1).strip().split()
        screen = self._screen
        error = ""
        if screen == "desktop" and command == ["open", "menu"]:
            self._screen = "menu"
        elif screen == "menu" and len(command) == 2 and command[0] == "select" and command[1] in APPS:
            self._screen, self._fields = command[1], {}
        elif screen == "menu" and command == ["close"]:
            self._screen = "desktop"
        elif screen in APPS and command == ["back"]:
            self._screen = "menu"
        elif screen in APPS and command == ["submit"]:
            goal = task.answer
            fields_match = all(self._fields.get(f) == v for f, v in goal["fields"].items())
            reward = 1.0 if screen == goal["app"] and fields_match else 0.0
            return StepResult("", reward, True, {"submitted": dict(self._fields), "app": screen})
        elif screen in APPS and len(command) == 2 and command[0] == "type" and "=" in command[1]:
            field, value = command[1].split("=", 1)
            if field not in APPS[screen]:
                error = f"no field {field}"
            elif not self._valid_value(field, value):
                error = f"invalid value for {field}"
            else:
                self._fields[field] = value
        else:
            error = "action not available here"
        fields = self._fields if self._screen in APPS else None
        return StepResult(self._observe(self._screen, fields, error), 0.0, False, {"screen": self._screen})

    def _demonstrate(self, task: Task) -> list[str]:
        goal = task.answer
        typed = [f"<act>type {field}={value}</act>" for field, value in goal["fields"].items()]
        return ["<act>open menu</act>", f"<act>select {goal['app']}</act>", *typed, "<act>submit</act>"]
