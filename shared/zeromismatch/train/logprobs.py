"""The trainer's recompute of per-token logprobs for (prompt, response) pairs.

For each pair the trainer feeds ``prompt + response[:-1]`` (the last response token is
never an input) as one complete sequence in *trainer mode* (no cache, contiguous
packed attention), takes the hidden rows that predict the response tokens, projects
them with the model's ``compute_logits`` (fp32) and evaluates the sampled tokens with
the engine's own ``token_logprobs`` -- the same KernelSet ``processed_log_softmax``
(temperature -> top-k -> top-p -> renormalise, with each request's sampling params) or
``log_softmax`` (raw). Sequences are packed into micro-batches chosen here, independently
of how the engine batched them: by a sequence count (``micro_batch_size``), a token
budget (``max_tokens_per_micro_batch``) or both, in a packing order of the caller's
choice. The model may be built with a tensor-parallel group of any degree; the caller
runs this function on every rank.

``kernels=`` names the kernel set of the whole recompute -- model forward, LM head and
log-softmax -- so ``compute_logprobs(model, ..., kernels="default")`` is the default-kernel
trainer whatever set ``model`` was built with: when it is not the model's own set, the model
runs under it (``model.set_kernels``) for the duration of the call and gets its own set back
afterwards, also on error. The kernel sets share no weight state (packed-weight caches are
keyed by the weight tensors), so switching is free of side effects.

With the aligned kernel set the result is bitwise the engine's logprob for every token
sampled under the same weights; ``requires_grad=True`` keeps the autograd graph so the
same numbers feed a policy-gradient loss.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence

import torch

from ..kernels import get_kernels
from ..kernels.sampling import LOGPROBS_MODES, SamplingParams, token_logprobs
from ..kernels.selfcheck import verify_for_model
from ..models.batch import ForwardBatch


def plan_micro_batches(
    lengths: Sequence[int],
    micro_batch_size: int | None = None,
    max_tokens_per_micro_batch: int | None = None,
    order: Sequence[int] | None = None,
) -> list[list[int]]:
    """Greedy packing of sequence indices (in ``order``) into micro-batches that respect
    both limits; a sequence longer than the token budget gets a micro-batch of its own."""
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    order = list(range(len(lengths))) if order is None else list(order)
    if sorted(order) != list(range(len(lengths))):
        raise ValueError("order must be a permutation of the sequence indices")
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        full_count = micro_batch_size is not None and len(current) >= micro_batch_size
        full_tokens = (
            max_tokens_per_micro_batch is not None and tokens + lengths[i] > max_tokens_per_micro_batch
        )
        if current and (full_count or full_tokens):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += lengths[i]
    if current:
        batches.append(current)
    return batches


def _resolve_kernels(model, kernels):
    kernels = kernels if kernels is not None else getattr(model, "kernels", None)
    if kernels is None:
        raise ValueError("compute_logprobs needs kernels= (the model exposes no .kernels)")
    return get_kernels(kernels) if isinstance(kernels, str) else kernels


@contextlib.contextmanager
def _running_under(model, kernels):
    """Run ``model`` with ``kernels`` inside the block, restoring its own set afterwards."""
    own = getattr(model, "kernels", None)
    if own is kernels:
        yield
        return
    if own is None or not callable(getattr(model, "set_kernels", None)):
        raise TypeError(
            f"compute_logprobs(kernels=...) needs a model with .kernels and .set_kernels to run the "
            f"forward under that set; {type(model).__name__} lacks them"
        )
    model.set_kernels(kernels)
    try:
        yield
    finally:
        model.set_kernels(own)


def _check_order(order: Sequence[int] | None, count: int) -> None:
    """``order`` must list every prompt index exactly once (an index out of range or missing
    would otherwise be dropped silently)."""
    if order is None:
        return
    listed = list(order)
    try:
        indices = sorted(operator.index(i) for i in listed if not isinstance(i, bool))
    except TypeError:
        indices = None
    if indices is None or len(indices) != len(listed) or indices != list(range(count)):
        raise ValueError(f"order must be a permutation of range({count}), one entry per prompt; got {listed}")


def compute_logprobs(
    model,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    logprobs_mode: str | None = None,
    micro_batch_size: int | None = None,
    max_tokens_per_micro_batch: int | None = None,
    order: Sequence[int] | None = None,
    kernels=None,
    requires_grad: bool = False,
) -> list[torch.Tensor]:
    """Per-token logprobs (fp32 ``[len(response)]`` each) of ``responses`` given ``prompts``.

    ``logprobs_mode`` overrides every request's ``sampling_params.logprobs_mode``; with no
    sampling params the mode defaults to "raw" (temperature 1, no top-k/top-p)."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params or SamplingParams(logprobs_mode="raw")] * len(prompts)
    if len(sampling_params) != len(prompts):
        raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} SamplingParams")
    if logprobs_mode is not None and logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    _check_order(order, len(prompts))
    kernels = _resolve_kernels(model, kernels)
    verify_for_model(kernels, model)
    prompts = [list(p) for p in prompts]
    responses = [list(r) for r in responses]
    for i, prompt in enumerate(prompts):
        if not prompt and responses[i]:  # an empty response (e.g. an engine error output) needs none
            raise ValueError(f"prompt {i} is empty")
    results: list[torch.Tensor | None] = [None] * len(prompts)
    todo = [i for i in range(len(prompts)) if responses[i]]
    for i in range(len(prompts)):
        if not responses[i]:
            results[i] = torch.zeros(0, dtype=torch.float32)
    lengths = [len(prompts[i]) + len(responses[i]) - 1 for i in todo]
    sub_order = None
    if order is not None:
        position = {idx: k for k, idx in enumerate(todo)}
        sub_order = [position[i] for i in order if i in position]
    grad = torch.enable_grad() if requires_grad else torch.no_grad()
    with grad, _running_under(model, kernels):
        for micro in plan_micro_batches(lengths, micro_batch_size, max_tokens_per_micro_batch, sub_order):
            members = [todo[k] for k in micro]
            _micro_batch(model, kernels, prompts, responses, sampling_params, logprobs_mode, members, results)
    return results  # type: ignore[return-value]


def _micro_batch(model, kernels, prompts, responses, sampling_params, mode, members, results) -> None:
    sequences = [torch.tensor(prompts[i] + responses[i][:-1], dtype=torch.int64) for i in members]
    batch = ForwardBatch.for_training(sequences)
    hidden = model.forward(batch, None)
    rows: list[int] = []
    targets: list[int] = []
    row_params: list = []
    for offset, i in zip(batch.cu_seqlens_q[:-1].tolist(), members):
        start = offset + len(prompts[i]) - 1
        rows.extend(range(start, start + len(responses[i])))
        targets.extend(responses[i])
        row_params.extend([sampling_params[i]] * len(responses[i]))
    logits = model.compute_logits(hidden[torch.tensor(rows, dtype=torch.int64)])
    target = torch.tensor(targets, dtype=torch.int64, device=logits.device)
    logprobs = token_logprobs(kernels, logits, row_params, target, mode)
    for piece, i in zip(torch.split(logprobs, [len(responses[i]) for i in members]), members):
        results[i] = piece


def recompute_outputs(model, outputs, **kwargs) -> list[torch.Tensor]:
    """``compute_logprobs`` for engine ``RequestOutput``s, with each request's own sampling params."""
    return compute_logprobs(
        model,
        [o.prompt_token_ids for o in outputs],
        [o.token_ids for o in outputs],
        [o.sampling_params for o in outputs],
        **kwargs,
    )
