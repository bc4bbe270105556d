"""Request and output types of the engine (vLLM v1 shapes, trimmed to what RL needs).

A ``Request`` is the engine's mutable record of one sequence: its prompt, the tokens
sampled so far with their logprobs and the weight version each was sampled under,
how many of its tokens have K/V (or SSM state) in the cache, and which cache blocks
and state slot it holds. ``RequestOutput`` is the immutable snapshot handed to users.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..kernels.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"  # sampled a stop token
    FINISHED_LENGTH = "finished_length"  # reached max_tokens or the model's context length
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"  # rejected at admission (bad input)

    @property
    def finished(self) -> bool:
        return self not in _UNFINISHED


#: (a frozenset lookup: ``finished`` is asked for every request every step)
_UNFINISHED = frozenset({RequestStatus.WAITING, RequestStatus.RUNNING})

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(eq=False)  # identity semantics: two requests are never 'equal'
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # resolved sampling seed (params.seed or one drawn by the engine)
    arrival: int  # admission order; scheduling priority (lower first)
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V (or SSM state) is in the cache
    block_ids: list[int] = field(default_factory=list)
    state_slot: int | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at (last) admission
    num_hashed_blocks: int = 0  # leading blocks already registered in the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)
    kv_version: int | None = None  # weight version its cached K/V was computed under (None: mixed)
    error: str | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def finished(self) -> bool:
        return self.status.finished

    def to_output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            token_ids=list(self.output_token_ids),
            logprobs=list(self.output_logprobs),
            weight_versions=list(self.output_versions),
            finished=self.finished,
            finish_reason=FINISH_REASONS.get(self.status),
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
            sampling_params=self.params,
            seed=self.seed,
        )


@dataclass(frozen=True)
class RequestOutput:
    """What ``LLM.generate`` / ``LLM.step`` return for one request.

    ``logprobs[i]`` is the logprob of ``token_ids[i]`` in ``sampling_params.logprobs_mode``
    and ``weight_versions[i]`` the weight version that produced it. ``finish_reason`` is
    "stop", "length", "abort", "error" or None (still running)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finished: bool
    finish_reason: str | None
    num_cached_tokens: int = 0
    error: str | None = None
    sampling_params: SamplingParams | None = None
    seed: int | None = None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"
