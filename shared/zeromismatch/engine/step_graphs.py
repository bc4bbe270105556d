"""The runner's decode step graphs: a pure-decode step's forward captured once per batch layout and
replayed after (``kernels/step_graph.py`` says what is recorded and why a replay gives the eager
forward's bits). This is the engine side of vLLM's CUDA graphs, with vLLM's switch:
``LLM(..., enforce_eager=True)`` turns it off.

- **Which steps.** Steps whose every chunk is one decode token, on a single-process engine whose
  model keeps no recurrent state (a replay that diverges is rerun eagerly, which would apply a
  Mamba2 state update twice). Prefill and chunked prefill always run eagerly.
- **Keys.** A graph is keyed on ``(num_tokens, num_seqs, block-table width)`` plus the thread count
  and inference mode. The block table is padded to a power of two (at least ``MIN_WIDTH``)
  columns, so a growing context needs a new graph only when its width doubles: the kernels read a
  sequence's blocks only below its kv_len, so padding changes no bit (tested).
- **Warm-up.** A key's first step runs eagerly (it fills the packed-weight and rope-table caches,
  whose building the capture would otherwise record); the second is captured (the capture run is
  that step's real forward); later ones copy the step's batch into the graph's input tensor and
  replay.
- **Staleness.** The graphs read weights and the KV cache by address. Before a replay the graph's
  guard checks every parameter and buffer of the model for replacement or an in-place change
  (``update_weights`` copies in place), and the runner's cache for replacement: either drops every
  graph, and capture starts over with a warm-up.
- **Refusal.** A capture that did something a replay cannot repeat (a host read of tensor data, a
  random op: the default and pure-torch aligned kernel sets read lengths on the host) turns graphs
  off for this runner, with the reason in ``disabled_reason``; so does a replay whose native call
  returns another status than at capture (``ReplayDiverged``), after which the step reruns eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.step_graph import Guard, ReplayDiverged, StepGraph, capture
from ..models.batch import ForwardBatch, ModelCache

#: the narrowest padded block table (columns)
MIN_WIDTH = 16
#: graphs kept per runner (the oldest is dropped past this)
MAX_GRAPHS = 32
#: eager steps of a key before it is captured
WARMUP_STEPS = 1


@dataclass
class _Entry:
    graph: StepGraph
    base: torch.Tensor  # the batch's int64 fields, which the graph reads (runner.batch_values)
    batch: ForwardBatch
    hidden: torch.Tensor  # the graph's output, rewritten by every replay
    guard: Guard


def padded_width(blocks: int) -> int:
    width = MIN_WIDTH
    while width < blocks:
        width *= 2
    return width


class DecodeGraphs:
    """Step graphs of one runner (module docstring); ``forward`` returns None for a step it does
    not serve, and the runner then runs the step eagerly."""

    def __init__(self, enabled: bool, cache: ModelCache):
        self.enabled = bool(enabled)
        self.disabled_reason: str | None = None if enabled else "enforce_eager"
        self.graphs: dict[tuple, _Entry] = {}
        self.seen: dict[tuple, int] = {}
        self.captures = self.replays = 0
        if self.enabled and any(state is not None for state in cache.ssm_state + cache.conv_state):
            self.disable("the model keeps recurrent (conv/SSM) state, which a rerun would update twice")

    def disable(self, why: str) -> None:
        self.enabled = False
        self.disabled_reason = why
        self.clear()

    def clear(self) -> None:
        self.graphs.clear()
        self.seen.clear()

    def stats(self) -> dict:
        return {
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "graphs": len(self.graphs),
            "captures": self.captures,
            "replays": self.replays,
        }

    def forward(self, runner, chunks) -> tuple[ForwardBatch, torch.Tensor] | None:
        if not self.enabled or any(chunk.num_tokens != 1 for chunk in chunks):
            return None
        width = padded_width(max(len(chunk.request.block_ids) for chunk in chunks))
        values, layout = runner.batch_values(chunks, width)
        key = (layout, torch.get_num_threads(), torch.is_inference_mode_enabled())
        entry = self.graphs.get(key)
        if entry is not None and not entry.guard.holds():
            self.clear()  # weights changed: every graph reads stale packed weights
            entry = None
        if entry is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= WARMUP_STEPS:
                return None
            return self._capture(runner, key, values, layout)
        entry.base.copy_(torch.tensor(values, dtype=torch.int64))
        try:
            entry.graph.replay()
        except ReplayDiverged as err:
            self.disable(str(err))
            return None
        self.replays += 1
        return entry.batch, entry.hidden

    def _capture(self, runner, key, values, layout) -> tuple[ForwardBatch, torch.Tensor]:
        from .runner import batch_from_values

        base = torch.tensor(values, dtype=torch.int64)
        model, cache = runner.model, runner.cache

        def step():
            batch = batch_from_values(base, layout)
            return batch, model.forward(batch, cache)

        graph, (batch, hidden) = capture(step)
        self.captures += 1
        if graph.refused is not None:
            self.disable(f"capture refused: {graph.refused}")
            return batch, hidden  # the capture run was this step's eager forward
        if len(self.graphs) >= MAX_GRAPHS:
            self.graphs.pop(next(iter(self.graphs)))
        self.graphs[key] = _Entry(graph, base, batch, hidden, Guard(model))
        return batch, hidden
