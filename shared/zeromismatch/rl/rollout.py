"""Rollouts: drive env episodes with the rollout engine, one batched turn at a time.

Every episode of a batch is a request to the engine; all episodes that still act
in a turn are generated together (continuous batching inside the engine). A model
turn ends at EOS or at a closing marker (``</calc>``, ``</answer>``, ``</fix>``,
``</act>``); the env then answers and, in multi-turn envs, its observation tokens are
appended to the transcript — they are *not* sampled by the policy, so they carry no
logprob and no loss (``model_mask`` False). Sampling seeds derive from
(run seed, batch, episode, turn) only, so a batch is the same whichever executor or
process generates it.

With an :class:`InflightUpdate` the batch's turns are driven step by step (the engine's step API)
and the update is applied before the engine step that follows the batch's ``at_step``-th one, with
requests in flight: they then carry on ("keep"), are drained first ("wait") or are aborted and
generated again from their start under the new weights ("abort"). Every token keeps the version
that sampled it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine import SamplingParams
from ..envs import default_tokenizer, make_env
from ..envs.tokenizer import MARKERS

_ENV_WRITTEN = ("</result>", "</error>", "</obs>")
CLOSING_MARKERS = tuple(m for m in MARKERS if m.startswith("</") and m not in _ENV_WRITTEN)


@dataclass
class Episode:
    """One finished episode: the prompt, then the transcript with per-token provenance."""

    group_id: int
    task_seed: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)  # nan at env-written tokens
    versions: list[int] = field(default_factory=list)  # weight version per token (-1 for env tokens)
    model_mask: list[bool] = field(default_factory=list)
    reward: float = 0.0
    solved: bool = False  # graded apart from the reward where the env does (StepResult.solved)
    turns: int = 0
    truncated: bool = False

    @property
    def num_model_tokens(self) -> int:
        return sum(self.model_mask)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def stop_token_ids() -> tuple[int, ...]:
    tok = default_tokenizer()
    return (tok.eos_id, *(tok.stoi[m] for m in CLOSING_MARKERS))


UNASSIGNED_TOKEN_TEXT = "<unk>"


def _action_text(token_ids: list[int]) -> str:
    """The env's view of a model turn. A control token (``<pad>``, ``<bos>``, ``<sep>``) or an id the
    tokenizer does not assign (the model's vocabulary is larger) that the policy sampled stays visible
    to the grader, as its name or ``<unk>``: dropping it would credit ``<answer>1<pad>2</answer>`` as
    ``12``. The ending EOS is the turn's stop signal, not text."""
    tok = default_tokenizer()
    return "".join(
        UNASSIGNED_TOKEN_TEXT if t >= tok.vocab_size else tok.decode([t], skip_control=False)
        for t in token_ids
        if t != tok.eos_id
    )


def request_seed(run_seed: int, batch_index: int, episode_index: int, turn: int) -> int:
    return (((run_seed * 1_000_003 + batch_index) * 100_003 + episode_index) * 101 + turn) % (2**62)


@dataclass
class InflightUpdate:
    """A weight update that lands during a batch: ``apply()`` swaps the engine's weights (the caller's
    ``update_weights`` with its mode), once, after ``at_step`` engine steps of the batch (counted
    across its turns). A batch done in fewer steps never applies it."""

    at_step: int
    apply: Callable[[], None]
    steps: int = 0  # engine steps of this batch so far
    applied_at_step: int | None = None
    regenerated: int = 0  # requests an abort-mode update cut off and that were generated again

    def apply_if_due(self) -> None:
        if self.applied_at_step is None and self.steps >= self.at_step:
            self.apply()
            self.applied_at_step = self.steps


def _generate_stepwise(engine, contexts, params, update: InflightUpdate, episode_ids: list[int]):
    """``engine.generate(contexts, params)`` driven one engine step at a time so that ``update`` can
    land between two steps. Outputs are read from ``step()`` only (keyed by request id): a drained
    request's output arrives there like any other; an aborted one is submitted again with its own
    sampling seed, so it is generated from its start under the new weights."""
    update.apply_if_due()  # due at a turn boundary: nothing is in flight, every mode is a plain swap
    owner: dict[str, int] = {}
    for j, (context, p) in enumerate(zip(contexts, params)):
        try:
            owner[engine.add_request(context, p)] = j
        except (ValueError, TypeError) as err:
            raise RuntimeError(f"rollout request for episode {episode_ids[j]} failed: {err}") from None
    outputs: dict[int, object] = {}
    while len(outputs) < len(contexts):
        update.apply_if_due()
        for out in engine.step():
            j = owner.pop(out.request_id, None) if out.finished else None
            if j is None:
                continue
            if out.aborted:
                owner[engine.add_request(contexts[j], params[j])] = j
                update.regenerated += 1
            else:
                outputs[j] = out
        update.steps += 1
    return [outputs[j] for j in range(len(contexts))]


def collect_episodes(
    engine,
    env_name: str,
    task_seeds: list[int],
    group_size: int,
    *,
    batch_index: int,
    run_seed: int,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    max_new_tokens: int = 16,
    logprobs_mode: str = "processed",
    split: str = "train",
    env_options: dict | None = None,
    inflight: InflightUpdate | None = None,
) -> list[Episode]:
    """``group_size`` episodes for each task seed; returns them in (task, member) order. ``inflight``:
    a weight update to land during the batch (module docstring)."""
    tok = default_tokenizer()
    stops = stop_token_ids()
    envs, episodes = [], []
    for group_id, task_seed in enumerate(task_seeds):
        for _ in range(group_size):
            env = make_env(env_name, **(env_options or {}))
            prompt = env.reset(task_seed, split)
            envs.append(env)
            episodes.append(Episode(group_id, task_seed, tok.encode(prompt, add_bos=True)))
    active = list(range(len(episodes)))
    turn = 0
    while active:
        contexts = [episodes[i].prompt_ids + episodes[i].response_ids for i in active]
        params = [
            SamplingParams(
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=request_seed(run_seed, batch_index, i, turn),
                stop_token_ids=stops,
                logprobs_mode=logprobs_mode,
            )
            for i in active
        ]
        if inflight is None or inflight.applied_at_step is not None:
            outputs = engine.generate(contexts, params)
        else:
            outputs = _generate_stepwise(engine, contexts, params, inflight, active)
        still_active = []
        for i, out in zip(active, outputs):
            ep = episodes[i]
            if out.error:
                raise RuntimeError(f"rollout request for episode {i} failed: {out.error}")
            ep.response_ids.extend(out.token_ids)
            ep.rollout_logprobs.extend(out.logprobs)
            ep.versions.extend(out.weight_versions)
            ep.model_mask.extend([True] * len(out.token_ids))
            ep.turns += 1
            result = envs[i].step(_action_text(out.token_ids))
            if result.done:
                ep.reward = float(result.reward)
                ep.solved = result.solved
                ep.truncated = bool(result.info.get("truncated", False))
                continue
            observation = tok.encode(result.observation)
            room = engine.max_model_len - len(ep.prompt_ids) - len(ep.response_ids) - len(observation) - 1
            if room < 1:
                ep.reward, ep.truncated = 0.0, True
                continue
            ep.response_ids.extend(observation)
            ep.rollout_logprobs.extend([math.nan] * len(observation))
            ep.versions.extend([-1] * len(observation))
            ep.model_mask.extend([False] * len(observation))
            still_active.append(i)
        active = still_active
        turn += 1
    return episodes


def demonstration_tokens(env_name: str, n: int, seed: int, env_options: dict | None = None):
    """SFT data: (prompt_ids, response_ids, model_mask) for ``n`` correct episodes. A model turn
    that does not end in a closing marker is terminated by EOS, as the rollout expects."""
    tok = default_tokenizer()
    env = make_env(env_name, **(env_options or {}))
    data = []
    for demo in env.demonstrations(n, seed=seed):
        response, mask = [], []
        for action, observation in demo.turns:
            ids = tok.encode(action)
            if not any(action.endswith(m) for m in CLOSING_MARKERS):
                ids.append(tok.eos_id)
            response += ids
            mask += [True] * len(ids)
            if observation:
                obs = tok.encode(observation)
                response += obs
                mask += [False] * len(obs)
        data.append((tok.encode(demo.prompt, add_bos=True), response, mask))
    return data
