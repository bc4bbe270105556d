"""``LLM``: the engine's front door (vLLM-shaped), plus the step API for RL loops.

``LLM(model, kernels="aligned", ...)`` wires request validation, the continuous-
batching scheduler, the paged block manager with its version-keyed prefix cache, the
model runner and the sampler. ``generate`` runs a list of prompts to completion;
``add_request`` / ``step`` / ``has_unfinished`` / ``abort`` let an RL loop interleave
generation with ``update_weights``. Every sampled token carries its logprob (in the
request's ``logprobs_mode``) and the weight version that produced it.

Bad input (empty prompt, a prompt that leaves no room under the model's context
length, token ids outside the vocabulary, bad sampling parameters) is rejected per
request with one ValueError/TypeError; ``generate`` turns it into an output with
``finish_reason="error"`` and keeps serving the other prompts. Token ids are Python or numpy
integers (never bools). The engine's sizes (``max_num_seqs``, ``block_size``, ...) and the GEMM
environment variables are checked, naming them, before the model is built.

The PipelineRL fixes (S2) are explicit options: ``logprobs_mode`` per request (fix 1),
``prefix_cache_versioned`` (fix 2), the ``update_weights`` mode (fix 3) and the kernel
set's lm_head precision (fix 4: aligned = fp32 head; default = activation-dtype head).
``kv_cache_dtype="fp8_e4m3"`` (bf16/fp16 models) rounds cached K/V through e4m3 with unit scales,
as vLLM's option does (``models/causal_lm.py::allocate_cache``); the trainer, which has no cache,
does not, so it is one of the stock stack's mismatch paths.
``tp > 1`` runs the same engine SPMD in spawned gloo workers (see ``tp.py``).
"""

from __future__ import annotations

import itertools
import numbers
import sys
import warnings
from collections.abc import Sequence

import torch

from ..kernels import get_kernels
from ..kernels.aligned.gemm import check_gemm_environment
from ..kernels.quant import check_kv_cache_dtype
from ..kernels.sampling import SamplingParams
from ..kernels.selfcheck import verify_for_model
from ..models.quantized import QUANT_FORMATS as WEIGHT_FORMATS
from .kv_cache import BlockManager
from .request import Request, RequestOutput, RequestStatus
from .runner import ModelRunner
from .scheduler import Scheduler
from .weights import merged_state_dict, validate_update_mode

QUANT_FORMATS = ("none", *WEIGHT_FORMATS)


def build_preset(preset: str, kernels="aligned", dtype=torch.float32, seed=0, quant=None, tp_group=None):
    """``build_model`` + (optionally) ``quantize_model``: what the engine, the trainer and
    ``zm parity`` all use, so both sides start from the same weights and formats."""
    from .. import models

    if quant not in (None, *QUANT_FORMATS):
        raise ValueError(f"quant must be one of {QUANT_FORMATS}, got {quant!r}")
    model = models.build_model(preset, kernels=kernels, dtype=dtype, seed=seed, tp_group=tp_group)
    if quant not in (None, "none"):
        quantize = getattr(models, "quantize_model", None)
        if quantize is None:
            raise ValueError("this build of zeromismatch.models has no quantize_model")
        quantize(model, quant)
    return model


def build_trainer_model(preset, kernels, dtype, seed, quant, tp_group=None):
    """The trainer's model as the RL learner holds it: master weights in ``dtype`` and, with a weight
    format, the fake-quantized forward (the engine's quantize -> dequantize, straight-through).
    ``zm parity`` and ``zm bisect`` build their trainer side with it."""
    from ..models import fake_quantize_model

    model = build_preset(preset, kernels, dtype, seed, None, tp_group=tp_group)
    return model if quant in (None, "none") else fake_quantize_model(model, quant)


def resolve_model(model, kernels, dtype, seed, quant=None, tp_group=None):
    if isinstance(model, str):
        return build_preset(model, kernels, dtype, seed, quant, tp_group)
    if quant not in (None, "none"):
        raise ValueError("quant= applies to a preset name; quantize a model object before passing it")
    if hasattr(model, "set_kernels"):
        model.set_kernels(kernels)
    return model


def warn_prefix_caching_ignored(model_class: type, stacklevel: int) -> None:
    """An explicit ``enable_prefix_caching=True`` on a model without prefix caching: said once,
    not dropped silently (a hybrid's Mamba2 state summarises its whole prefix and cannot be
    rebuilt from cached K/V blocks; models/hybrid.py)."""
    warnings.warn(
        f"enable_prefix_caching=True is ignored: {model_class.__name__} does not support prefix "
        "caching (per-sequence recurrent state); every prompt is prefilled",
        stacklevel=stacklevel + 1,
    )


class LLM:
    def __new__(cls, *args, tp: int = 1, tp_group=None, **kwargs):
        if cls is LLM and tp > 1 and tp_group is None:
            from .tp import TensorParallelLLM

            return TensorParallelLLM(*args, tp=tp, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        model,
        kernels="aligned",
        *,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        prefill_chunk: int | None = None,
        enable_prefix_caching: bool | None = None,
        prefix_cache_versioned: bool = True,
        block_size: int = 16,
        num_blocks: int | None = None,
        max_model_len: int | None = None,
        quant: str | None = None,
        lm_head_precision: str = "fp32",
        tp: int = 1,
        tp_group=None,
        enforce_eager: bool = False,
        kv_cache_dtype: str = "auto",
    ):
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive int, got {tp!r}")
        if tp != 1 and tp_group is None:
            raise ValueError("LLM(tp>1) is served by TensorParallelLLM; pass tp_group only from its workers")
        # checked before the model is built, by the names the caller used (the scheduler and the
        # cache would otherwise refuse them later, under their own internal names)
        check_engine_sizes(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
            num_blocks=num_blocks, max_model_len=max_model_len, prefill_chunk=prefill_chunk,
        )  # fmt: skip
        check_gemm_environment()  # a bad GEMM variable fails here, not inside the first engine step
        # a preset's activation dtype is known before it is built: bad values fail before any work
        check_kv_cache_dtype(kv_cache_dtype, dtype if isinstance(model, str) else None)
        self.kernels = get_kernels(kernels) if isinstance(kernels, str) else kernels
        self.model = resolve_model(model, kernels, dtype, seed, quant, tp_group)
        check_kv_cache_dtype(kv_cache_dtype, _activation_dtype(self.model, kv_cache_dtype))
        self.kv_cache_dtype = kv_cache_dtype
        # a tensor-parallel rank must not carry on alone after a failed forward (its peers may be
        # blocked in a collective): there a step's exception propagates and TensorParallelLLM
        # takes the group down
        self._recover_failed_steps = tp_group is None
        verify_for_model(self.kernels, self.model)
        self.vocab_size = int(self.model.config.vocab_size)
        model_max = int(self.model.config.max_position_embeddings)
        self.max_model_len = min(max_model_len or model_max, model_max)
        supports_prefix = bool(getattr(self.model, "supports_prefix_caching", True))
        if enable_prefix_caching and not supports_prefix:
            warn_prefix_caching_ignored(type(self.model), stacklevel=2)
        # None (the default): on wherever the model supports it
        wanted = True if enable_prefix_caching is None else bool(enable_prefix_caching)
        self.enable_prefix_caching = supports_prefix and wanted
        if num_blocks is None:
            per_seq = -(-self.max_model_len // block_size)
            num_blocks = max(per_seq, min(max_num_seqs * per_seq, 4096))
        self.block_manager = BlockManager(
            num_blocks, block_size, self.enable_prefix_caching, prefix_cache_versioned
        )
        if not isinstance(enforce_eager, bool):
            raise TypeError(f"enforce_eager must be a bool, got {enforce_eager!r}")
        # step graphs replay a captured decode forward (step_graphs.py); a tensor-parallel rank's
        # forward runs collectives, which are not recorded: ranks run eagerly
        self.runner = ModelRunner(
            self.model, self.kernels, num_blocks, block_size, max_num_seqs, lm_head_precision,
            step_graphs=not enforce_eager and tp_group is None, kv_cache_dtype=kv_cache_dtype,
        )  # fmt: skip
        # models with per-sequence recurrent state (Mamba2 layers) need a state slot per request
        uses_state_slots = any(state is not None for state in self.runner.cache.ssm_state)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs, max_num_batched_tokens, prefill_chunk, uses_state_slots
        )
        self.weight_version = 0
        self._seed_generator = torch.Generator().manual_seed(seed)
        self._arrivals = itertools.count()
        self._ids = itertools.count()
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []  # finished outside step() (drain/abort), delivered by step()
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_generated_tokens = 0

    # ---- requests ----------------------------------------------------------
    def add_request(
        self, prompt_token_ids, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue one request; returns its id. Raises ValueError/TypeError on bad input."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        tokens = validate_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)
        check_stop_tokens(params, self.vocab_size)
        total = min(len(tokens) + params.max_tokens, self.max_model_len)
        if -(-total // self.block_manager.block_size) > self.block_manager.num_blocks:
            raise ValueError(f"request needs {total} tokens of KV cache; the cache holds fewer")
        if request_id is None:
            # automatic ids skip any id a caller chose for a request still in flight
            request_id = str(next(self._ids))
            while request_id in self._requests:
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self._requests and not self._requests[request_id].finished:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_generator))
        request = Request(request_id, tokens, params, seed, next(self._arrivals))
        self._requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> RequestOutput:
        request = self._requests.get(str(request_id))
        if request is None:
            raise ValueError(f"unknown request id {request_id!r}")
        if not request.finished:
            self.scheduler.release(request)
            request.status = RequestStatus.FINISHED_ABORTED
        self._requests.pop(request.request_id, None)
        return request.to_output()

    # ---- one engine step ---------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward, sample. Returns outputs of requests that sampled a token
        this step (finished or not) and of requests finished by a drain/abort since the last step."""
        return self._step(collect=True)

    def _step(self, collect: bool, owned: set[str] | None = None) -> list[RequestOutput]:
        # collect=False (generate): no per-step output snapshots (each copies the token lists) for
        # generate's own requests (``owned``); the outputs of other requests that finish meanwhile
        # (added through add_request) and of drains/aborts are queued for the next step()
        outputs: list[RequestOutput] = []
        if collect:
            outputs, self._pending = self._pending, []
        plan = self.scheduler.schedule(self.weight_version)
        self.num_preemptions += len(plan.preempted)
        try:
            results = self.runner.execute(plan.chunks)
        except Exception as err:  # noqa: BLE001 - reported per request, the engine keeps serving
            if not self._recover_failed_steps:
                raise
            failed = self._fail_requests([chunk.request for chunk in plan.chunks], err)
            if collect:
                outputs.extend(failed)
            else:
                self._pending.extend(o for o in failed if owned is None or o.request_id not in owned)
            self.num_steps += 1
            return outputs
        # (this loop and the next run for every request every step: attribute lookups hoisted)
        register = self.block_manager.register_computed if self.block_manager.enable_prefix_caching else None
        for chunk in plan.chunks:
            chunk.request.num_computed_tokens += chunk.num_tokens
            if register is not None:
                register(chunk.request)
        version, max_model_len = self.weight_version, self.max_model_len
        self.num_generated_tokens += len(results)
        for chunk, token, logprob in results:
            request = chunk.request
            token_ids = request.output_token_ids
            token_ids.append(token)
            request.output_logprobs.append(logprob)
            request.output_versions.append(version)
            params = request.params
            if token in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
            elif len(token_ids) >= params.max_tokens:
                request.status = RequestStatus.FINISHED_LENGTH
            elif request.num_tokens >= max_model_len:
                request.status = RequestStatus.FINISHED_LENGTH
            if request.finished:
                self.scheduler.release(request)
                self._requests.pop(request.request_id, None)
            if collect:
                outputs.append(request.to_output())
            elif request.finished and owned is not None and request.request_id not in owned:
                self._pending.append(request.to_output())
        self.num_steps += 1
        return outputs

    def _fail_requests(self, requests: list[Request], err: Exception) -> list[RequestOutput]:
        """End the requests of a step whose forward raised: each gets ``finish_reason="error"`` with
        the message, and its blocks back; the requests that were not in the step carry on."""
        message = f"engine step failed: {type(err).__name__}: {err}"
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        failed = []
        for request in requests:
            if request.finished:
                continue
            self.scheduler.release(request)
            request.status = RequestStatus.FINISHED_ERROR
            request.error = message
            self._requests.pop(request.request_id, None)
            failed.append(request.to_output())
        return failed

    def generate(
        self, prompts, params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run ``prompts`` (token-id lists) to completion; outputs in prompt order. A bad
        prompt yields an output with ``finish_reason="error"`` and its message in ``error``."""
        if isinstance(params, SamplingParams) or params is None:
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        requests: list[Request | None] = []
        errors = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                requests.append(self._requests[self.add_request(prompt, p)])
            except (ValueError, TypeError) as err:
                requests.append(None)
                errors[i] = str(err)
        owned = {r.request_id for r in requests if r is not None}
        while any(r is not None and not r.finished for r in requests):
            self._step(collect=False, owned=owned)
        return [
            error_output(f"error-{i}", prompts[i], params[i], errors[i]) if r is None else r.to_output()
            for i, r in enumerate(requests)
        ]

    # ---- weights -----------------------------------------------------------
    def update_weights(self, weights, mode: str = "keep", recompute_kv: bool = True) -> list[RequestOutput]:
        """Swap in ``weights`` (HF names; a subset is fine) and bump the weight version.

        Returns the outputs of requests finished by the update: drained ones for "wait",
        aborted partial ones for "abort", none for "keep". The next ``step()`` delivers the same
        outputs once more, so a consumer of the step API sees every finished request there: read
        one of the two channels, not both (or key outputs by request id). See ``weights.py``."""
        validate_update_mode(mode)
        merged = merged_state_dict(self.model, weights)
        finished: list[RequestOutput] = []
        if mode == "wait":
            while self.has_unfinished():
                finished.extend(o for o in self.step() if o.finished)
        elif mode == "abort":
            for request in self.scheduler.unfinished():
                self.scheduler.release(request)
                request.status = RequestStatus.FINISHED_ABORTED
                self._requests.pop(request.request_id, None)
                finished.append(request.to_output())
        self.model.load_state_dict_hf(merged)
        self.weight_version += 1
        if mode == "keep":
            for request in self.scheduler.unfinished():
                if recompute_kv:
                    self.scheduler.reset_computation(request)
                else:
                    request.kv_version = None  # its cache now mixes versions: never register it
        self._pending.extend(finished)
        return finished

    def prefix_cache_hits(self) -> int:
        return self.block_manager.hits


def validate_prompt(prompt_token_ids, vocab_size: int, max_model_len: int) -> list[int]:
    """The prompt as a list of Python ints, or one ValueError/TypeError saying what is wrong with it
    (the engine's rules, shared by every engine that serves the project's models)."""
    numpy = sys.modules.get("numpy")  # only an imported numpy can have made the prompt
    if isinstance(prompt_token_ids, torch.Tensor) or (
        numpy is not None and isinstance(prompt_token_ids, numpy.ndarray)
    ):
        prompt_token_ids = prompt_token_ids.tolist()
    if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
        raise TypeError(f"prompt must be a sequence of token ids, got {type(prompt_token_ids).__name__}")
    tokens = list(prompt_token_ids)
    if not tokens:
        raise ValueError("prompt is empty: a request needs at least one prompt token")
    for i, token in enumerate(tokens):
        if type(token) is not int:
            # numpy integers (np.int64 read from an array) are token ids too, stored as Python
            # ints; a bool is not (True would silently be token 1)
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise TypeError(f"prompt token ids must be ints, got {token!r}")
            tokens[i] = int(token)
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    if len(tokens) >= max_model_len:
        raise ValueError(
            f"prompt has {len(tokens)} tokens; the model's maximum context is {max_model_len} "
            "and at least one token must be generated"
        )
    return tokens


def check_stop_tokens(params: SamplingParams, vocab_size: int) -> None:
    bad_stops = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad_stops:
        raise ValueError(f"stop_token_ids outside the vocabulary [0, {vocab_size}): {bad_stops}")


def check_engine_sizes(**sizes) -> None:
    """ValueError/TypeError naming the argument when one of the engine's sizes is not an int >= 1
    (``num_blocks``, ``max_model_len`` and ``prefill_chunk`` may also be None: derived / no limit)."""
    optional = ("num_blocks", "max_model_len", "prefill_chunk")
    for name, value in sizes.items():
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "an int >= 1 or None" if name in optional else "an int >= 1"
            raise TypeError(f"{name} must be {kind}, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _activation_dtype(model, kv_cache_dtype: str) -> torch.dtype | None:
    """The model's activation dtype, which an FP8 KV cache must be able to serve (None for "auto",
    which serves any); a model object without a ``dtype`` cannot be checked, so it cannot have one."""
    if kv_cache_dtype == "auto":
        return None
    dtype = getattr(model, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r} needs a model with a torch dtype (its activations'); "
            f"{type(model).__name__} has none"
        )
    return dtype


def error_output(request_id: str, prompt, params, message: str) -> RequestOutput:
    try:
        prompt_ids = list(prompt)
    except TypeError:
        prompt_ids = []
    return RequestOutput(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        token_ids=[],
        logprobs=[],
        weight_versions=[],
        finished=True,
        finish_reason="error",
        error=message,
        sampling_params=params if isinstance(params, SamplingParams) else None,
    )
