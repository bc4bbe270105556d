"""The common env protocol: seeded tasks, disjoint train/eval splits, multi-turn steps, demonstrations.

An env turns ``(split, seed)`` into one task deterministically (``random.Random`` seeded with a string,
which Python hashes with SHA-512, so the same task comes back in every process whatever PYTHONHASHSEED).
Splits are disjoint twice over: train and eval draw from differently named seed streams, and every task
is assigned to exactly one split by a SHA-256 hash of its *split key* (a task whose hash falls in the
other split is redrawn), so no eval prompt can ever appear in training even if two seeds collide.

The split key is what decides the answer, not the prompt text: by default the prompt, but an env whose
distinct prompts share an answer-deciding core overrides ``split_key`` (arithmetic: ``3+4`` and ``4+3``;
code repair: every bug whose fix is the same line). Keyed by prompt, those twins fell on
both sides, and a model that memorised training tasks scored on held-out ones by lookup.

Episode: ``prompt = env.reset(seed, split)``; then ``env.step(action)`` returns a ``StepResult`` with
the env's observation text (appended to the transcript in multi-turn envs), a reward, and ``done``.
Rewards are verifiable: computed by code from the task, never by a model.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SPLITS", "Demonstration", "Env", "StepResult", "Task"]

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Task:
    """One problem instance: the prompt shown to the model and what the env needs to grade it."""

    prompt: str
    answer: Any  # env-specific ground truth (an int, a slot assignment, a goal state ...)
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """``info["solved"]``, when an env sets it on the final step, is whether the episode solved the task,
    graded apart from the reward (code repair: hidden tests); otherwise solved means reward 1.0."""

    observation: str  # env text appended after the action ("" when done)
    reward: float
    done: bool
    info: dict = field(default_factory=dict)

    @property
    def solved(self) -> bool:
        return bool(self.info.get("solved", self.reward == 1.0)) and self.done


@dataclass(frozen=True)
class Demonstration:
    """A correct episode: the prompt and (model action, env observation) turns.

    ``response`` is the whole transcript after the prompt. For SFT only model-written text should carry
    loss; ``segments()`` says which text is which.
    """

    prompt: str
    turns: tuple[tuple[str, str], ...]

    @property
    def response(self) -> str:
        return "".join(action + observation for action, observation in self.turns)

    def segments(self) -> list[tuple[str, bool]]:
        """[(text, written_by_model)] in order; observations are env-written."""
        out: list[tuple[str, bool]] = []
        for action, observation in self.turns:
            out.append((action, True))
            if observation:
                out.append((observation, False))
        return out


class Env(ABC):
    """Base class: subclasses implement ``_make_task`` and ``_step`` (and ``_demonstrate``)."""

    name: str = "env"
    max_turns: int = 1
    #: one split key in ``eval_modulus`` (by its hash) belongs to the eval split
    eval_modulus: int = 5
    #: whether "solved" is graded apart from the reward (``StepResult.solved``); a run then records the
    #: share of each step's episodes that solved their task (``solved_rate``) beside the reward
    grades_apart: bool = False

    def __init__(self) -> None:
        self._task: Task | None = None
        self._turns = 0
        self._done = True

    # ---- tasks and splits -------------------------------------------------------------------
    @abstractmethod
    def _make_task(self, rng: random.Random) -> Task:
        """Draw one task using only ``rng``."""

    def split_key(self, task: Task) -> str:
        """What decides ``task``'s answer; tasks with equal keys always fall in the same split."""
        return task.prompt

    def split_of(self, task: Task) -> str:
        return self.split_of_key(self.split_key(task))

    def split_of_key(self, key: str) -> str:
        """The split every task with split key ``key`` belongs to."""
        digest = hashlib.sha256(f"{self.name}\n{key}".encode()).digest()
        return "eval" if int.from_bytes(digest[:8], "big") % self.eval_modulus == 0 else "train"

    def task(self, seed: int, split: str = "train") -> Task:
        """The task for ``seed`` in ``split`` (deterministic; never a task of the other split)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        rng = random.Random(f"{self.name}/{split}/{seed}")
        for _ in range(10_000):
            task = self._make_task(rng)
            if self.split_of(task) == split:
                return task
        raise RuntimeError(f"{self.name}: no {split} task found for seed {seed} in 10000 draws")

    # ---- episodes ------------------------------------------------------------------------------
    def reset(self, seed: int, split: str = "train") -> str:
        self._task = self.task(seed, split)
        self._turns = 0
        self._done = False
        self._reset_state(self._task)
        return self._task.prompt

    def _reset_state(self, task: Task) -> None:  # noqa: B027 (optional hook, deliberately empty)
        """Hook for envs with per-episode state beyond the task."""

    @property
    def current_task(self) -> Task:
        if self._task is None:
            raise RuntimeError(f"{self.name}: call reset() before using the episode")
        return self._task

    def step(self, action: str) -> StepResult:
        if not isinstance(action, str):
            raise TypeError(f"action must be str, got {type(action).__name__}")
        task = self.current_task
        if self._done:
            raise RuntimeError(f"{self.name}: the episode is over; call reset()")
        self._turns += 1
        result = self._step(task, action)
        if not result.done and self._turns >= self.max_turns:
            info = dict(result.info, truncated=True, solved=False)
            result = StepResult(observation="", reward=0.0, done=True, info=info)
        self._done = result.done
        return result

    @abstractmethod
    def _step(self, task: Task, action: str) -> StepResult:
        """Apply one model action to the current episode."""

    def score(self, response: str) -> float:
        """Reward of a single-turn ``response`` to the current task (one step; the episode ends)."""
        result = self.step(response)
        if not result.done:
            raise ValueError(f"{self.name} is multi-turn and the response did not finish it; use step()")
        return result.reward

    def run_episode(self, seed: int, policy: Callable[[str], str], split: str = "train") -> tuple[str, float]:
        """Drive one episode with ``policy(transcript) -> action``; returns (transcript, final reward)."""
        transcript = self.reset(seed, split)
        while True:
            action = policy(transcript)
            result = self.step(action)
            transcript += action + result.observation
            if result.done:
                return transcript, result.reward

    # ---- SFT warm start --------------------------------------------------------------------------
    @abstractmethod
    def _demonstrate(self, task: Task) -> list[str]:
        """The model actions of a correct episode for ``task``."""

    def demonstrations(self, n: int, seed: int = 0, split: str = "train") -> list[Demonstration]:
        """``n`` correct episodes on tasks ``seed .. seed + n - 1`` of ``split``, replayed through step()
        so every observation is the env's own."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        demos = []
        for index in range(seed, seed + n):
            prompt = self.reset(index, split)
            turns = []
            for action in self._demonstrate(self.current_task):
                result = self.step(action)
                turns.append((action, result.observation))
                if result.done:
                    break
            if not (result.done and result.reward == 1.0 and result.solved):
                raise RuntimeError(f"{self.name}: demonstration for seed {index} did not earn reward 1")
            demos.append(Demonstration(prompt=prompt, turns=tuple(turns)))
        return demos
