"""Model runner: turns a scheduler step into one packed ``ForwardBatch`` and samples.

All scheduled chunks of a step (decodes, prefills, prefill chunks) go into a single
forward in engine mode: tokens are packed in schedule order, each chunk's new K/V is
written to its slots (``slot_mapping``) and its queries attend to the whole context
through the block table (``kv_lens`` = computed + new). Only the last row of chunks
that reach their request's last known token is projected to logits (fp32, through the
model's ``compute_logits``, or an activation-dtype head when ``lm_head_precision`` asks for
it) and sampled. A step whose chunks are all one decode token is served by a step graph
when one is captured for its layout (``step_graphs.py``: the same ops replayed, so the same
bits; ``LLM(enforce_eager=True)`` turns graphs off).
"""

from __future__ import annotations

import torch

from ..kernels.quant import check_kv_cache_dtype
from ..models.batch import ForwardBatch, ModelCache
from .sampler import Sampler
from .scheduler import ScheduledChunk
from .step_graphs import DecodeGraphs

#: "fp32": the model's own ``compute_logits`` (the kernel set's head; fp32 in the aligned set).
#: "activation": a stock engine's head, a GEMM in the activation dtype upcast afterwards --
#: the rollout side of S2's fix 4, kept to show the mismatch it causes.
LM_HEAD_PRECISIONS = ("fp32", "activation")


class ModelRunner:
    def __init__(
        self,
        model,
        kernels,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        lm_head_precision: str = "fp32",
        step_graphs: bool = True,
        kv_cache_dtype: str = "auto",
    ):
        if lm_head_precision not in LM_HEAD_PRECISIONS:
            raise ValueError(
                f"lm_head_precision must be one of {LM_HEAD_PRECISIONS}, got {lm_head_precision!r}"
            )
        check_kv_cache_dtype(kv_cache_dtype)  # (the model's allocate_cache checks its dtype)
        self.lm_head_precision = lm_head_precision
        self.kv_cache_dtype = kv_cache_dtype
        self.model = model
        self.kernels = kernels
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        self.sampler = Sampler(kernels)
        self.cache: ModelCache = self._allocate_cache()
        self.graphs = DecodeGraphs(step_graphs, self.cache, model)

    def _allocate_cache(self) -> ModelCache:
        # "auto" is not passed: a model object's allocate_cache need not know kv_cache_dtype
        extra = {} if self.kv_cache_dtype == "auto" else {"kv_cache_dtype": self.kv_cache_dtype}
        cache = self.model.allocate_cache(self.num_blocks, self.block_size, self.max_num_seqs, **extra)
        if getattr(cache, "kv_cache_dtype", "auto") != self.kv_cache_dtype:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r}: {type(self.model).__name__}.allocate_cache "
                f"returned a {getattr(cache, 'kv_cache_dtype', 'auto')!r} cache"
            )
        return cache

    def reset_cache(self) -> None:
        """Fresh cache tensors (e.g. after a weight update with a different dtype), of the same
        ``kv_cache_dtype`` (and unit FP8 scales: ``CausalLM.allocate_cache``)."""
        self.cache = self._allocate_cache()
        self.graphs.clear()

    def build_batch(self, chunks: list[ScheduledChunk]) -> ForwardBatch:
        values, layout = self.batch_values(chunks)
        return batch_from_values(torch.tensor(values, dtype=torch.int64), layout)

    def batch_values(self, chunks: list[ScheduledChunk], width: int | None = None) -> tuple[list[int], tuple]:
        """Every int64 field of the step's ``ForwardBatch`` in one list (one tensor conversion per
        step; ``batch_from_values`` views it) and its layout ``(num_tokens, num_seqs, max_blocks)``.
        ``width`` pads the block table to that many columns (step graphs bucket it)."""
        bs = self.block_size
        input_ids, positions, slots, table = [], [], [], []
        q_lens, kv_lens, state_slots = [], [], []
        max_blocks = max(len(c.request.block_ids) for c in chunks)
        if width is not None:
            max_blocks = max(max_blocks, width)
        for chunk in chunks:
            request = chunk.request
            start, n = chunk.start, chunk.num_tokens
            end = start + n
            block_ids = request.block_ids
            if n == 1:  # decode: skip the range/list machinery
                input_ids.append(_token_at(request, start))
                positions.append(start)
                slots.append(block_ids[start // bs] * bs + start % bs)
            else:
                input_ids.extend(_token_slice(request, start, end))
                positions.extend(range(start, end))
                slots.extend(block_ids[p // bs] * bs + p % bs for p in range(start, end))
            q_lens.append(n)
            kv_lens.append(end)
            table.extend(block_ids)
            if len(block_ids) < max_blocks:
                table.extend([0] * (max_blocks - len(block_ids)))
            state_slots.append(request.state_slot if request.state_slot is not None else 0)
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        values = input_ids + positions + slots + cu + kv_lens + state_slots + table
        return values, (len(input_ids), len(chunks), max_blocks)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head_precision == "fp32":
            return self.model.compute_logits(hidden)
        weight = self.model.lm_head_weight
        return torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()

    @torch.no_grad()
    def execute(self, chunks: list[ScheduledChunk]):
        """Run one forward over ``chunks``; sample for the chunks that reach their end.

        Returns ``[(chunk, token_id, logprob)]`` for the sampling chunks, in chunk order."""
        if not chunks:
            return []
        model_kernels = getattr(self.model, "kernels", self.kernels)
        if model_kernels is not self.kernels and getattr(model_kernels, "name", None) != self.kernels.name:
            # LLM(model_object, ...) sets the object's kernel set; another engine (or caller) given the
            # same object has since switched it, which would silently run this engine's forward on
            # other kernels than its sampler and the trainer it is compared with
            raise RuntimeError(
                f"the model's kernel set was changed to {model_kernels.name!r} after this engine set "
                f"it to {self.kernels.name!r}: engines must not share a model object (pass a copy)"
            )
        graphed = self.graphs.forward(self, chunks)
        if graphed is None:
            batch = self.build_batch(chunks)
            hidden = self.model.forward(batch, self.cache)
        elif graphed.tokens is not None:  # the graph sampled too (every chunk of a decode step samples)
            return list(zip(chunks, graphed.tokens.tolist(), graphed.logprobs.tolist()))
        else:
            assert graphed.batch is not None  # (the engine's graphs keep their batch: DecodeGraphs.forward)
            batch, hidden = graphed.batch, graphed.hidden
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if not sampling:
            return []
        if len(sampling) == hidden.shape[0]:  # every row samples (a decode step): no gather
            logits = self.compute_logits(hidden)
        else:
            rows = batch.cu_seqlens_q[1:][sampling] - 1
            logits = self.compute_logits(hidden[rows])
        requests = [chunks[i].request for i in sampling]
        out = self.sampler(
            logits,
            [r.params for r in requests],
            [r.seed for r in requests],
            [len(r.output_token_ids) for r in requests],
        )
        return [(chunks[i], t, lp) for i, t, lp in zip(sampling, out.token_ids, out.logprobs)]


def batch_from_values(base: torch.Tensor, layout: tuple) -> ForwardBatch:
    """The ``ForwardBatch`` whose fields are views of ``base`` (``ModelRunner.batch_values``)."""
    num_tokens, num_seqs, max_blocks = layout
    sizes = [num_tokens] * 3 + [num_seqs + 1] + [num_seqs] * 2 + [num_seqs * max_blocks]
    ids_t, positions_t, slots_t, cu_t, kv_t, state_t, table_t = base.split(sizes)
    return ForwardBatch(
        input_ids=ids_t,
        positions=positions_t,
        cu_seqlens_q=cu_t,
        kv_lens=kv_t,
        block_table=table_t.view(num_seqs, max_blocks),
        slot_mapping=slots_t,
        state_slots=state_t,
        # (has_initial_state: the model derives it where it has recurrent state; an op every step
        # for the others)
    )


def _token_at(request, position: int) -> int:
    prompt = request.prompt_token_ids
    if position < len(prompt):
        return prompt[position]
    return request.output_token_ids[position - len(prompt)]


def _token_slice(request, start: int, end: int) -> list[int]:
    """``request.all_token_ids[start:end]`` without building the whole list every step."""
    prompt, output = request.prompt_token_ids, request.output_token_ids
    n_prompt = len(prompt)
    if end <= n_prompt:
        return prompt[start:end]
    if start >= n_prompt:
        return output[start - n_prompt : end - n_prompt]
    return prompt[start:] + output[: end - n_prompt]
