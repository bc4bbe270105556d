"""The sampler: one definition of the sampling distribution, per-request seeded draws.

For a batch of rows (one per request that samples this step) the sampler
1. computes the processed logprobs with ``kernels.processed_log_softmax`` (temperature
   -> top-k -> top-p -> renormalise; greedy at temperature 0) -- the same function the
   trainer's recompute calls, so both sides agree on what "the distribution the token
   was drawn from" is;
2. draws each row's token by the exponential race ``argmax(logprob - log E)``, E ~ Exp(1)
   i.i.d. per vocabulary entry (equivalent to sampling from softmax(logprob)); E = -log U
   with U ~ U[0, 1) drawn by ``uniform_`` from a ``torch.Generator`` seeded with
   ``mix(request seed, token index)`` (``uniform_`` measured ~6x cheaper than
   ``exponential_`` per row on CPU; U = 0 is raised to the smallest normal float, so that
   E stays finite and an entry the distribution keeps can always win; where the native
   library builds, ``kernels/native/random.c`` computes the same MT19937 draws for all rows
   in one call, bit for bit, 6-18x faster than the per-row loop at batch 32), so a
   request's draw never depends on which other requests share the batch, on its row in the
   batch, or on preemption;
3. reports the sampled token's logprob in the request's ``logprobs_mode``: "processed"
   (from step 1) or "raw" (``kernels.log_softmax`` of the unprocessed logits).
Masked entries are -inf in step 1 and can never win the race.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.native import random as native_random
from ..kernels.sampling import SamplingParams, sampling_tensors, token_logprobs

__all__ = ["Sampler", "SamplerOutput", "mix_seed", "sampling_tensors", "token_logprobs"]

_MASK64 = (1 << 64) - 1
_TINY = torch.finfo(torch.float32).tiny


def mix_seed(seed: int, token_index: int) -> int:
    """splitmix64 of (seed, token index): a well-spread 63-bit generator seed. torch's CPU generator
    (MT19937) uses its low 32 bits, so there are 2^32 distinct noise streams."""
    z = (seed * 0x9E3779B97F4A7C15 + token_index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float]  # fp32 values, exactly representable as Python floats


class Sampler:
    def __init__(self, kernels):
        self.kernels = kernels
        # one generator, re-seeded per draw: manual_seed resets its whole state, so a draw is the
        # same as from a fresh generator with that seed (and costs no allocation)
        self._generator = torch.Generator(device="cpu")
        # the parameter tensors of the last call, reused while the same SamplingParams objects
        # come in the same order (a decode loop); holds the objects so their ids stay unique
        self._last_params: tuple[list[SamplingParams], tuple] | None = None

    def _param_tensors(self, params: list[SamplingParams], device):
        last = self._last_params
        if (
            last is not None
            and len(last[0]) == len(params)
            and all(a is b for a, b in zip(last[0], params))
            and last[1][0].device == torch.device(device)
        ):
            return last[1]
        # SamplingParams is frozen, so equal objects mean equal tensors
        tensors = sampling_tensors(params, device)
        self._last_params = (list(params), tensors)
        return tensors

    def __call__(
        self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], token_indices: list[int]
    ) -> SamplerOutput:
        if logits.dtype != torch.float32:
            raise TypeError(f"sampler expects fp32 logits, got {logits.dtype}")
        if not len(params) == len(seeds) == len(token_indices) == logits.shape[0]:
            raise ValueError(
                f"sampler got {logits.shape[0]} logit rows but {len(params)} params, {len(seeds)} seeds "
                f"and {len(token_indices)} token indices"
            )
        temperature, top_k, top_p = self._param_tensors(params, logits.device)
        stream_seeds = native_random.seed_tensor([mix_seed(s, i) for s, i in zip(seeds, token_indices)])
        processed, token_tensor = self.race(logits, temperature, top_k, top_p, stream_seeds)
        if all(p.logprobs_mode == "processed" for p in params):
            chosen = processed.gather(1, token_tensor.view(-1, 1)).view(-1)
        else:
            chosen = token_logprobs(self.kernels, logits, params, token_tensor)
        return SamplerOutput(token_tensor.cpu().tolist(), chosen.cpu().tolist())

    def race(self, logits, temperature, top_k, top_p, stream_seeds: torch.Tensor):
        """The processed logprobs ``[rows, vocab]`` and each row's drawn token (module docstring, steps
        1-2); ``stream_seeds`` holds each row's generator seed (``native_random.seed_tensor``). Tensor
        ops and native calls only, where the native library builds: a step graph replays it
        (engine/step_graphs.py)."""
        processed = self.kernels.processed_log_softmax(logits, temperature, top_k, top_p)
        # row i of the noise is filled from request i's own generator stream (a contiguous row of
        # vocab entries, exactly what a fresh [vocab] tensor would get); log, the race and argmax
        # are elementwise / per row, so batching them changes no row's bits
        noise = native_random.uniform_rows_from(stream_seeds, logits.shape[1])
        if noise is None:  # no native library here: the same draws from torch's generator
            noise = torch.empty(logits.shape, dtype=torch.float32)
            generator = self._generator
            for row, stream_seed in zip(noise.unbind(0), stream_seeds.tolist()):
                generator.manual_seed(stream_seed & _MASK64)
                row.uniform_(generator=generator)
        # U = 0 (probability 2^-24 per entry) would give E = inf and a race value of -inf: with a
        # single finite entry (greedy, top_k = 1, a tiny top_p) every entry would then be -inf and
        # argmax would return token 0, a token of probability 0. The smallest normal float instead
        # keeps every entry finite; no other draw changes (every nonzero U is >= 2^-24).
        noise.clamp_(min=_TINY)
        log_e = noise.log_().neg_().log_()  # log E, E = -log U ~ Exp(1)
        # argmax(processed - log E): the first maximum per row (nan first), native where it builds
        token = native_random.race_argmax(processed.cpu(), log_e)
        if token is None:
            token = torch.argmax(processed.cpu() - log_e, dim=1)
        return processed, token.to(logits.device)
