"""The runner's decode step graphs: a pure-decode step's forward captured once per batch layout and
replayed after (``kernels/step_graph.py`` says what is recorded and why a replay gives the eager
forward's bits). This is the engine side of vLLM's CUDA graphs, with vLLM's switch:
``LLM(..., enforce_eager=True)`` turns it off.

- **Which steps.** Steps whose every chunk is one decode token, on a single-process engine (a
  tensor-parallel rank's collectives are not recorded). Prefill and chunked prefill always run
  eagerly.
- **What a graph covers.** The model's forward, and -- when every row has the same (temperature,
  top_k, top_p), reports processed logprobs, has no temperature in (0, 1), and the noise comes
  from the native library -- the lm_head and the sampler's race too (``Sampler.race``: processed
  logprobs, each row's noise from its stream seed, argmax), so a replay returns the tokens and
  their logprobs. With such a temperature the eager sampler checks ``logits / t`` for overflow on
  the host every step, which a replay would skip; rows with different parameters would need a
  graph per mix (found in review: slower than eager with per-row random temperatures). There the
  graph stops at the hidden states and the sampler runs eagerly.
- **FP8 KV cache.** With ``kv_cache_dtype="fp8_e4m3"`` each attention layer's K/V rounding
  (``kernels/quant.py::fp8_kv_roundtrip``: divide, clamp, casts, multiply) is aten ops on the step's
  tensors and the cache's scale tensors, recorded and replayed like any other, so a replay gives the
  eager step's bits (tests/engine/test_kv_cache_fp8.py); the scales are read from their tensors at
  every replay, not baked in.
- **Keys.** A graph is keyed on ``(num_tokens, num_seqs, block-table width)``, the thread count,
  inference mode and, when it samples, the rows' shared (temperature, top_k, top_p) by value (the
  sampler's top-k / top-p plan is built from them at capture). The block table is padded to a
  power of two (at least ``MIN_WIDTH``) columns, so a growing context needs a new graph only when
  its width doubles: the kernels read a sequence's blocks only below its kv_len, so padding
  changes no bit (tested). Each step's input ids, positions, slots, lengths, block table and noise
  seeds are copied into the graph's input tensors before the replay.
- **Warm-up.** A key's first step is captured (the capture run is that step's real forward); later
  ones replay. The prefill before it has filled the packed-weight and rope-table caches; a capture
  that still had to pack weights is retaken at the key's next step (``WARMUP_STEPS`` eager steps
  first, none by default: an eager warm-up step cost ~1 ms of a 128-token generate), up to
  ``MAX_CAPTURES_PER_KEY`` tries: weights packed anew at every call (MoE experts dequantized from
  FP8 / NVFP4 at every step) are then repacked by the graph too, as by the eager step.
- **Memory.** A graph holds its own intermediates: at most ``MAX_GRAPHS`` graphs and
  ``MAX_GRAPH_BYTES`` of them together, least recently used dropped first; a graph larger than
  that on its own is not kept (its key runs eagerly).
- **Staleness.** The graphs read weights and the KV cache by address. Before every graph step a
  guard (``kernels/step_graph.py::Guard``) checks the weights the graphs were captured against, as
  the eager kernels' caches do on every call; a change (``update_weights`` copies in place; a
  ``.data`` assignment; ``clear_packed_weights``) drops every graph, and capture starts over with
  a warm-up. ``ModelRunner.reset_cache`` (a new KV cache) drops them too. When the weights change
  ``MAX_FRUITLESS_ROUNDS`` times in a row before any graph is replayed (an RL loop with short
  rollouts and an update per step), graphs go off for the engine: each round only paid for
  captures.
- **Cost.** The first capture in a process imports ``torch._dynamo`` (about a second; entering a
  ``TorchDispatchMode`` needs it); later captures take a few milliseconds. The guard costs ~14 us
  a step for tiny-qwen3's 27 tensors.
- **Refusal and divergence.** A capture that did something a replay cannot repeat (a host read of
  tensor data, a random op: the default and pure-torch aligned kernel sets read lengths on the
  host) turns graphs off for this runner, with the reason in ``disabled_reason``. A replay whose
  native call returns another status than at capture (``ReplayDiverged``: a rope position past
  the native table, a bad block id) gives up that graph's key (``stats()["keys_given_up"]``) and
  the step reruns eagerly -- unless the model keeps recurrent state (Mamba2 conv/SSM): the partial
  replay has already updated it, a rerun would update it twice, so the step raises instead and its
  requests end with that error (``LLM.step`` reports it per request).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..kernels.capture.record_replay import Guard, ReplayDiverged, StepGraph, capture
from ..kernels.native import random as native_random
from ..models.batch import ForwardBatch, ModelCache
from .sampler import mix_seed, sampling_tensors

#: the narrowest padded block table (columns)
MIN_WIDTH = 16
#: graphs kept per runner, and the memory their own tensors may take together (intermediates: a
#: graph that samples holds ~17 fp32 [rows, vocab] tensors); the least recently used goes first
MAX_GRAPHS = 32
MAX_GRAPH_BYTES = 1 << 30
#: eager steps of a key before it is captured
WARMUP_STEPS = 0
#: weight changes in a row before any replay after which graphs go off (``forward``)
MAX_FRUITLESS_ROUNDS = 3
#: tries at a capture that packs no weights (each retaken at the key's next step) before one that
#: does is kept: then the packing is part of every step, as in the eager engine (``_capture``)
MAX_CAPTURES_PER_KEY = 3


@dataclass
class GraphStep:
    """A step served by a graph: its batch and final hidden states, and -- when the graph also
    samples -- each row's token and its processed logprob (tensors the next replay rewrites)."""

    batch: ForwardBatch | None  # (None: a ``forward_values`` step, whose batch its caller built)
    hidden: torch.Tensor
    tokens: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None


@dataclass
class _Entry:
    graph: StepGraph
    #: the graph's int64 inputs: the batch's fields (runner.batch_values), then, when the graph
    #: samples, the rows' noise-stream seeds
    inputs: torch.Tensor
    step: GraphStep
    packer: struct.Struct | None = None

    def write_inputs(self, values: list[int] | torch.Tensor) -> None:
        """A step's inputs into the graph's input tensor, in one call: a list packed straight into its
        memory (``torch.tensor(values)`` and a copy cost ~40 us for a batch of 32, this ~5 us), a
        tensor copied."""
        if isinstance(values, torch.Tensor):
            self.inputs.copy_(values)
            return
        if self.packer is None:
            self.packer = struct.Struct(f"={len(values)}q")
        self.packer.pack_into(self.inputs.numpy(), 0, *values)


def padded_width(blocks: int) -> int:
    width = MIN_WIDTH
    while width < blocks:
        width *= 2
    return width


class DecodeGraphs:
    """Step graphs of one runner (module docstring); ``forward`` returns None for a step it does
    not serve, and the runner then runs the step eagerly."""

    def __init__(self, enabled: bool, cache: ModelCache | None, model=None, recurrent: bool | None = None):
        """``recurrent``: whether the model keeps recurrent state (default: whether ``cache`` holds
        any); such a step cannot be rerun eagerly after a diverged replay."""
        self.enabled = bool(enabled)
        self.disabled_reason: str | None = None if enabled else "enforce_eager"
        self.graphs: OrderedDict[tuple, _Entry] = OrderedDict()  # least recently used first
        self.seen: dict[tuple, int] = {}  # steps (eager or captured) of keys without a graph
        self.given_up: dict[tuple, str] = {}  # keys that run eagerly for good, and why
        self.guard: Guard | None = None  # the weights every graph was captured against
        self.builds_persist = False  # captures keep building packed weights (see ``_capture``)
        self.captures = self.replays = 0
        self.round_replays = 0  # ``replays`` when the current weights' graphs began
        self.fruitless_rounds = 0  # weight changes in a row that came before any replay
        #: whether a step whose replay diverged can be rerun eagerly (no recurrent state to update twice)
        if recurrent is None:
            if cache is None:
                raise ValueError("DecodeGraphs needs the cache or recurrent= to know if steps can be rerun")
            recurrent = any(state is not None for state in cache.ssm_state + cache.conv_state)
        self.rerunnable = not recurrent
        if self.enabled and not isinstance(model, torch.nn.Module):
            self.disable("the model is not a torch.nn.Module, whose weights a guard could watch")

    def disable(self, why: str) -> None:
        self.enabled = False
        self.disabled_reason = why
        self.clear()

    def clear(self) -> None:
        self.graphs.clear()
        self.seen.clear()
        self.guard = None
        self.builds_persist = False

    @property
    def graph_bytes(self) -> int:
        return sum(entry.graph.private_bytes for entry in self.graphs.values())

    def stats(self) -> dict:
        return {
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "graphs": len(self.graphs),
            "graph_bytes": self.graph_bytes,
            "captures": self.captures,
            "replays": self.replays,
            "keys_given_up": dict(self.given_up),
        }

    def forward(self, runner, chunks) -> GraphStep | None:
        if not self.enabled:
            return None
        requests, blocks = [], 0
        for chunk in chunks:  # (one pass: every request, every step)
            if chunk.num_tokens != 1 or not chunk.samples:
                return None  # a prefill chunk, or one that does not sample
            request = chunk.request
            requests.append(request)
            blocks = max(blocks, len(request.block_ids))
        if not self._weights_hold():
            return None
        values, layout = runner.batch_values(chunks, padded_width(blocks))
        sampling = _sampling_key([request.params for request in requests])
        key = (layout, torch.get_num_threads(), torch.is_inference_mode_enabled(), sampling)
        seeds = [] if sampling is None else [mix_seed(r.seed, len(r.output_token_ids)) for r in requests]
        model, cache = runner.model, runner.cache

        def make_step(inputs: torch.Tensor):
            from .runner import batch_from_values

            # (mix_seed's values are below 2^63: int64 holds their bits, as native_random.seed_tensor makes)
            base, seed_values = inputs[: len(values)], inputs[len(values) :] if seeds else None
            params = sampling_tensors([r.params for r in requests]) if seeds else None

            def step() -> GraphStep:
                batch = batch_from_values(base, layout)
                hidden = model.forward(batch, cache)
                if params is None:
                    return GraphStep(batch, hidden)
                processed, tokens = runner.sampler.race(runner.compute_logits(hidden), *params, seed_values)
                return GraphStep(batch, hidden, tokens, processed.gather(1, tokens.view(-1, 1)).view(-1))

            return step

        state = cache.k_cache + cache.v_cache + cache.conv_state + cache.ssm_state
        return self._serve(key, values + seeds, make_step, model, [t for t in state if t is not None])

    def forward_values(self, model, state: list[torch.Tensor], values: torch.Tensor, layout: tuple, forward):
        """A pure-decode forward for an engine whose batches are built elsewhere (the vLLM plugin):
        ``forward(base)`` runs ``model`` on a batch whose fields are views of the int64 tensor
        ``base`` (``values`` at this step), reading and writing the cache tensors ``state``; its
        hidden states, replayed when a graph for ``layout`` exists, else None (the caller runs the
        step eagerly). Forward-only: sampling stays with the caller."""
        if not self.enabled or not self._weights_hold():
            return None
        key = (layout, torch.get_num_threads(), torch.is_inference_mode_enabled(), None)

        def make_step(inputs: torch.Tensor):
            def step() -> GraphStep:
                return GraphStep(None, forward(inputs))

            return step

        served = self._serve(key, values, make_step, model, state)
        return None if served is None else served.hidden

    def _weights_hold(self) -> bool:
        """False (after dropping every graph) when the weights the graphs read changed; an RL loop
        that updates the weights before its graphs were ever replayed (short rollouts) only pays for
        captures: after a few such rounds in a row, graphs go off for this engine."""
        if self.guard is None or self.guard.holds():
            return True
        self.fruitless_rounds = self.fruitless_rounds + 1 if self.replays == self.round_replays else 0
        self.clear()
        if self.fruitless_rounds >= MAX_FRUITLESS_ROUNDS:
            self.disable(
                f"the weights changed {MAX_FRUITLESS_ROUNDS} times in a row before any graph was "
                "replayed: captures cost more than they save here"
            )
            return False
        self.round_replays = self.replays
        return True

    def _serve(self, key, values, make_step, model, state: list[torch.Tensor]) -> GraphStep | None:
        """Replay ``key``'s graph on ``values``, or capture one (the capture run is the step's real
        forward), or None: the step runs eagerly."""
        entry = self.graphs.get(key)
        if entry is None:
            if key in self.given_up:
                return None
            if len(self.seen) > 4 * MAX_GRAPHS:  # (keys that come once, e.g. a shrinking batch's)
                self.seen.clear()
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= WARMUP_STEPS:
                return None
            return self._capture(key, values, make_step, model, state)
        self.graphs.move_to_end(key)
        entry.write_inputs(values)
        try:
            entry.graph.replay()
        except ReplayDiverged as err:
            # e.g. a rope position past the native table, which the eager step handles: this key runs
            # eagerly from now on
            del self.graphs[key]
            self.given_up[key] = str(err)
            if not self.rerunnable:
                raise RuntimeError(
                    f"a replayed decode step diverged ({err}) after updating the model's recurrent state, "
                    "which an eager rerun would update twice: the step's requests end here"
                ) from err
            return None
        self.replays += 1
        return entry.step

    def _capture(self, key, values, make_step, model, state: list[torch.Tensor]) -> GraphStep:
        if isinstance(values, torch.Tensor):
            inputs = values.clone()
        else:
            inputs = torch.tensor(values, dtype=torch.int64)
        step = make_step(inputs)

        # (forward has just checked the current guard; the first capture takes one)
        guard = self.guard or Guard(model)
        # what native calls may read without an aten op passing it: the weights (guarded), the
        # step's inputs and the cache
        graph, result = capture(step, held=guard.held() + [inputs] + state)
        self.captures += 1
        # A capture that packed weights (a cold or evicted cache entry) would repack them at every
        # replay: its step's result stands (it ran for real) and the key is captured again next
        # time. Weights packed anew at every call (MoE experts stacked from quantized weights at
        # every step) keep building: after a few tries the graph repacks them too, as the eager
        # step does, and later keys accept that at once (until the weights change: ``clear``).
        if graph.cache_builds and not self.builds_persist:
            if self.seen[key] < WARMUP_STEPS + MAX_CAPTURES_PER_KEY:
                return result
            self.builds_persist = True
        if graph.refused is not None:
            self.disable(f"capture refused: {graph.refused}")
            return result  # the capture run was this step's eager forward
        if graph.private_bytes > MAX_GRAPH_BYTES:
            self.given_up[key] = f"the graph would hold {graph.private_bytes} bytes (limit {MAX_GRAPH_BYTES})"
            return result
        graph.keep.extend(t for t in (result.tokens, result.logprobs) if t is not None)
        while self.graphs and (
            len(self.graphs) >= MAX_GRAPHS or self.graph_bytes + graph.private_bytes > MAX_GRAPH_BYTES
        ):
            self.graphs.popitem(last=False)
        self.graphs[key] = _Entry(graph, inputs, result)
        self.seen.pop(key, None)
        self.guard = guard
        return result


def _sampling_key(params) -> tuple | None:
    """The rows' shared (temperature, top_k, top_p), when the graph can sample too: every row has the
    same ones and reports processed logprobs, the noise comes from the native library, and the
    temperature is not in (0, 1) (dividing by such a temperature can overflow, which the eager
    sampler checks on the host, every step); else None, and the graph stops at the hidden states."""
    first = params[0]
    if first.logprobs_mode != "processed" or 0 < first.temperature < 1 or not native_random.available():
        return None
    key = (first.temperature, first.top_k, first.top_p)
    for p in params:
        # rows with different parameters: a forward-only graph (a key per mix would multiply captures)
        if p is not first and (p.logprobs_mode != "processed" or (p.temperature, p.top_k, p.top_p) != key):
            return None
    return key
