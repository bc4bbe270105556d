"""Continuous-batching scheduler with chunked prefill (vLLM v1 style, one token budget).

Every step the scheduler spends a budget of ``max_num_batched_tokens`` tokens:
1. running requests first, oldest first: each gets its remaining uncomputed tokens
   (1 for a decode, the rest of the prompt for a prefill), capped by ``prefill_chunk``
   and by the budget left. A request that cannot get cache blocks preempts the newest
   running request (recompute preemption: its blocks are freed and it re-prefills
   later -- it keeps its sampled tokens, logprobs and versions);
2. then waiting requests, oldest first, while there is budget and fewer than
   ``max_num_seqs`` running: each is first matched against the prefix cache, then
   scheduled like a prefill.
So requests join and leave at every step and a prompt may be split over several
steps (chunked prefill) in batches that also contain other requests' decodes. The
aligned kernels make a token's numbers independent of all of that; the scheduler
makes no attempt to keep batches stable.

Hybrid (Mamba) models also need a per-request state slot (``uses_state_slots``);
slots are assigned at admission and released when the request leaves.
"""

from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass, field

from .kv_cache import BlockManager
from .request import Request, RequestStatus

_ARRIVAL = operator.attrgetter("arrival")


@dataclass(slots=True)  # (32 made every step)
class ScheduledChunk:
    request: Request
    start: int  # first token position computed in this step
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the request's last known token (its logits sample)."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefill_chunk: int | None = None,
        uses_state_slots: bool = False,
    ):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 or None, got {prefill_chunk}")
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.uses_state_slots = uses_state_slots
        self.free_slots = list(range(max_num_seqs))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # ---- queue management --------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def unfinished(self) -> list[Request]:
        return sorted([*self.running, *self.waiting], key=lambda r: r.arrival)

    def release(self, request: Request) -> None:
        """Take a request out of the queues and give back its blocks and state slot."""
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        self.blocks.free(request)
        if request.state_slot is not None:
            self.free_slots.append(request.state_slot)
            self.free_slots.sort()
            request.state_slot = None

    def reset_computation(self, request: Request) -> None:
        """Forget a request's cached state; it will re-prefill everything it has."""
        self.blocks.free(request)
        request.num_computed_tokens = 0
        request.kv_version = None

    def _preempt(self, request: Request) -> None:
        self.release(request)
        request.num_computed_tokens = 0
        request.kv_version = None
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        # back into the queue in arrival order so it keeps its priority
        pending = sorted([request, *self.waiting], key=lambda r: r.arrival)
        self.waiting = deque(pending)

    def _chunk_size(self, request: Request, budget: int) -> int:
        remaining = request.num_tokens - request.num_computed_tokens
        if self.prefill_chunk is not None:
            remaining = min(remaining, self.prefill_chunk)
        return min(remaining, budget)

    # ---- one step ----------------------------------------------------------
    def schedule(self, version: int) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        running = RequestStatus.RUNNING
        for request in sorted(self.running, key=_ARRIVAL):
            if budget == 0:
                break
            if request.status is not running:  # preempted by an older request this step
                continue
            n = self._chunk_size(request, budget)
            if n == 0:
                continue
            while not self.blocks.allocate(request, n):
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                continue
            out.chunks.append(ScheduledChunk(request, request.num_computed_tokens, n))
            budget -= n
        if out.preempted:
            return out  # no admissions in a step that had to evict
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.uses_state_slots and not self.free_slots:
                break
            matched = request.num_computed_tokens == 0
            if matched:
                request.num_cached_tokens = self.blocks.match_prefix(request, version)
                if request.num_cached_tokens:
                    request.kv_version = version
            n = self._chunk_size(request, budget)
            if not self.blocks.allocate(request, n):
                if matched:
                    self.blocks.cancel_prefix_match(request, version)
                self.blocks.free(request)
                request.num_computed_tokens = 0
                break
            self.waiting.popleft()
            if request.num_computed_tokens == 0:
                request.kv_version = version
            if self.uses_state_slots:
                request.state_slot = self.free_slots.pop(0)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.chunks.append(ScheduledChunk(request, request.num_computed_tokens, n))
            budget -= n
        return out
