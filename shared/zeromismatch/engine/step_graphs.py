"""The runner's decode step graphs: a pure-decode step's forward captured once per batch layout and
replayed after (``kernels/step_graph.py`` says what is recorded and why a replay gives the eager
forward's bits). This is the engine side of vLLM's CUDA graphs, with vLLM's switch:
``LLM(..., enforce_eager=True)`` turns it off.

- **Which steps.** Steps whose every chunk is one decode token, on a single-process engine (a
  tensor-parallel rank's collectives are not recorded). Prefill and chunked prefill always run
  eagerly.
- **What a graph covers.** The model's forward, and -- when every row reports processed logprobs,
  no row has 0 < temperature < 1 and the noise comes from the native library -- the lm_head and
  the sampler's race too (``Sampler.race``: processed logprobs, each row's noise from its stream
  seed, argmax), so a replay returns the tokens and their logprobs. With such a temperature the
  eager sampler checks ``logits / t`` for overflow on the host every step, which a replay would
  skip, so there the graph stops at the hidden states and the sampler runs eagerly.
- **Keys.** A graph is keyed on ``(num_tokens, num_seqs, block-table width)``, the thread count,
  inference mode and, when it samples, every row's (temperature, top_k, top_p) by value (the
  sampler's top-k / top-p plan is built from them at capture). The block table is padded to a
  power of two (at least ``MIN_WIDTH``) columns, so a growing context needs a new graph only when
  its width doubles: the kernels read a sequence's blocks only below its kv_len, so padding
  changes no bit (tested). Each step's input ids, positions, slots, lengths, block table and noise
  seeds are copied into the graph's input tensors before the replay.
- **Warm-up.** A key's first step runs eagerly (it fills the packed-weight and rope-table caches,
  whose building the capture would otherwise record); the second is captured (the capture run is
  that step's real forward); later ones copy the step's batch into the graph's input tensor and
  replay.
- **Staleness.** The graphs read weights and the KV cache by address. Before a replay the graph's
  guard checks every parameter and buffer of the model for replacement or an in-place change
  (``update_weights`` copies in place); a failed guard drops every graph, and capture starts over
  with a warm-up. ``ModelRunner.reset_cache`` (a new KV cache) drops them too.
- **Cost.** The first capture in a process imports ``torch._dynamo`` (about a second; entering a
  ``TorchDispatchMode`` needs it); later captures take a few milliseconds.
- **Refusal.** A capture that did something a replay cannot repeat (a host read of tensor data, a
  random op: the default and pure-torch aligned kernel sets read lengths on the host) turns graphs
  off for this runner, with the reason in ``disabled_reason``; so does a replay whose native call
  returns another status than at capture (``ReplayDiverged``), after which the step reruns eagerly
  -- unless the model keeps recurrent state (Mamba2 conv/SSM): the partial replay has already
  updated it, a rerun would update it twice, so the step raises instead and its requests end with
  that error (``LLM.step`` reports it per request).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.native import random as native_random
from ..kernels.step_graph import Guard, ReplayDiverged, StepGraph, capture
from ..models.batch import ForwardBatch, ModelCache
from .sampler import mix_seed, sampling_tensors

#: the narrowest padded block table (columns)
MIN_WIDTH = 16
#: graphs kept per runner (the oldest is dropped past this)
MAX_GRAPHS = 32
#: eager steps of a key before it is captured
WARMUP_STEPS = 1


@dataclass
class GraphStep:
    """A step served by a graph: its batch and final hidden states, and -- when the graph also
    samples -- each row's token and its processed logprob (tensors the next replay rewrites)."""

    batch: ForwardBatch
    hidden: torch.Tensor
    tokens: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None


@dataclass
class _Entry:
    graph: StepGraph
    base: torch.Tensor  # the batch's int64 fields, which the graph reads (runner.batch_values)
    seeds: torch.Tensor | None  # the rows' noise-stream seeds, when the graph samples
    step: GraphStep
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
        #: whether a step whose replay diverged can be rerun eagerly (no recurrent state to update twice)
        self.rerunnable = all(state is None for state in cache.ssm_state + cache.conv_state)

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

    def forward(self, runner, chunks) -> GraphStep | None:
        if not self.enabled or any(chunk.num_tokens != 1 or not chunk.samples for chunk in chunks):
            return None
        requests = [chunk.request for chunk in chunks]
        width = padded_width(max(len(request.block_ids) for request in requests))
        values, layout = runner.batch_values(chunks, width)
        sampling = _sampling_key([request.params for request in requests])
        key = (layout, torch.get_num_threads(), torch.is_inference_mode_enabled(), sampling)
        entry = self.graphs.get(key)
        if entry is not None and not entry.guard.holds():
            self.clear()  # weights changed: every graph reads stale packed weights
            entry = None
        seeds = None
        if sampling is not None:
            seeds = native_random.seed_tensor([mix_seed(r.seed, len(r.output_token_ids)) for r in requests])
        if entry is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= WARMUP_STEPS:
                return None
            return self._capture(runner, key, values, layout, requests, seeds)
        entry.base.copy_(torch.tensor(values, dtype=torch.int64))
        if seeds is not None:
            entry.seeds.copy_(seeds)
        try:
            entry.graph.replay()
        except ReplayDiverged as err:
            self.disable(str(err))
            if not self.rerunnable:
                raise RuntimeError(
                    f"a replayed decode step diverged ({err}) after updating the model's recurrent state, "
                    "which an eager rerun would update twice: the step's requests end here"
                ) from err
            return None
        self.replays += 1
        return entry.step

    def _capture(self, runner, key, values, layout, requests, seeds) -> GraphStep:
        from .runner import batch_from_values

        base = torch.tensor(values, dtype=torch.int64)
        model, cache = runner.model, runner.cache
        params = sampling_tensors([r.params for r in requests]) if seeds is not None else None

        def step() -> GraphStep:
            batch = batch_from_values(base, layout)
            hidden = model.forward(batch, cache)
            if params is None:
                return GraphStep(batch, hidden)
            processed, tokens = runner.sampler.race(runner.compute_logits(hidden), *params, seeds)
            return GraphStep(batch, hidden, tokens, processed.gather(1, tokens.view(-1, 1)).view(-1))

        graph, result = capture(step)
        self.captures += 1
        if graph.refused is not None:
            self.disable(f"capture refused: {graph.refused}")
            return result  # the capture run was this step's eager forward
        graph.keep.extend(t for t in (result.tokens, result.logprobs) if t is not None)
        if len(self.graphs) >= MAX_GRAPHS:
            self.graphs.pop(next(iter(self.graphs)))
        self.graphs[key] = _Entry(graph, base, seeds, result, Guard(model))
        return result


def _sampling_key(params) -> tuple | None:
    """The rows' sampling parameters by value, when the graph can sample too: every row reports
    processed logprobs, the noise comes from the native library, and no row has 0 < temperature < 1
    (dividing by such a temperature can overflow, which the eager sampler checks on the host, every
    step); else None, and the graph stops at the hidden states."""
    if not native_random.available():
        return None
    key = []
    for p in params:
        if p.logprobs_mode != "processed" or 0 < p.temperature < 1:
            return None
        key.append((p.temperature, p.top_k, p.top_p))
    return tuple(key)
