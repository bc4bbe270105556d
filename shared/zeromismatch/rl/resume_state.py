"""What both executors put in a resumable checkpoint and take back out of it.

A checkpoint's ``state.pt`` holds ``RESUME_KEYS``: the learner's part (:func:`learner_state`: weights,
optimizer, version, this process's RNGs) plus the run's (``history``: the weight versions the next
batches are rolled out with; ``extra``: the warm-start record, ``next_step``, the cache counters so far).
The in-process executor builds it from its own learner; the Ray executor from its learner actor's part
and the driver's copies of the weight versions, so either executor's checkpoint is the same kind of file.
"""

from __future__ import annotations

from pathlib import Path

from ..train import checkpoint as ckpt
from .learner import Learner, state_snapshot

#: tests: ``"<step>"`` simulates a kill (``os._exit(13)``) right after that step's record is logged
CRASH_AFTER_STEP_ENV = "ZM_CRASH_AFTER_STEP"
RESUME_KEYS = ("model", "optimizer", "learner_version", "history", "rng", "extra")


def learner_state(learner: Learner) -> dict:
    """The learner's part of a resumable checkpoint (the run adds ``history`` and ``extra``)."""
    return {
        "model": state_snapshot(learner.model),
        "optimizer": learner.optimizer.state_dict(),
        "learner_version": learner.version,
        "rng": ckpt.capture_rng_state(),
    }


def restore_learner(learner: Learner, state: dict) -> None:
    """Put :func:`learner_state`'s parts back (and this process's RNGs)."""
    learner.model.load_state_dict_hf(state["model"])
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.version = state["learner_version"]
    ckpt.restore_rng_state(state["rng"])


def load_resumable(latest: Path) -> dict:
    """The state of the resumable checkpoint ``latest``; CheckpointError when it is none (a warm start
    saved alone holds only the model)."""
    state = ckpt.load_checkpoint(latest).state
    missing = [key for key in RESUME_KEYS if not isinstance(state, dict) or key not in state]
    if not missing and not (isinstance(state["extra"], dict) and "next_step" in state["extra"]):
        missing.append("extra.next_step")
    if missing:
        raise ckpt.CheckpointError(
            f"checkpoint {latest / 'state.pt'} has no {', '.join(missing)}: not a resumable training "
            "checkpoint (a warm start saved alone holds only the model); rerun without --resume"
        )
    return state


def add_counts(before: dict, since: dict) -> dict:
    """Cache counters over a resumed run: those a checkpoint carried plus the new engine's (which starts
    at 0). None: a counter the engine cannot count (the vLLM engine's stale prefix hits without the salt)."""

    def add(a, b):
        return None if a is None or b is None else a + b

    return {key: add(before.get(key, 0), value) for key, value in since.items()}
