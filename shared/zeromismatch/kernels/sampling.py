"""Sampling parameters of one request, and the sampling math the engine's sampler and the trainer's
recompute share: a sampled token's logprob under its request's distribution (``token_logprobs``).

They live in the kernels layer so that both sides call one definition and the trainer does not
import the engine. ``SamplingParams`` is validated once at construction.

The semantics are the KernelSet's ``processed_log_softmax``: temperature -> top-k ->
top-p -> renormalise, with temperature 0 meaning greedy. ``logprobs_mode`` says which
logprob the engine reports for a sampled token: "processed" = the logprob under the
distribution the sampler actually drew from (what an RL objective needs, PipelineRL
fix 1 in S2), "raw" = the log_softmax of the unprocessed logits (vLLM V1's default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOGPROBS_MODES = ("processed", "raw")
#: smallest non-zero temperature (vLLM's sampling epsilon); below it logits / T can overflow fp32
MIN_TEMPERATURE = 1e-5
#: largest |top_k| accepted (fits the sampler's int64 tensors with room to spare)
MAX_TOP_K = 2**31 - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # <= 0: off (vLLM's -1 is accepted too)
    top_p: float = 1.0  # 1.0: off
    max_tokens: int = 16
    seed: int | None = None  # None: the engine draws one from its own seeded generator
    stop_token_ids: tuple[int, ...] = ()
    logprobs_mode: str = "processed"

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(
                f"SamplingParams.temperature must be a number, got {type(self.temperature).__name__}"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be finite and >= 0, got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            # logits / T overflows fp32 for tiny T (1e-40 gave nan logprobs); vLLM treats T < 1e-5
            # as greedy, here it is an error so that greedy is always asked for explicitly
            raise ValueError(
                f"SamplingParams.temperature must be 0 (greedy) or >= {MIN_TEMPERATURE}, "
                f"got {self.temperature}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"SamplingParams.top_k must be an int, got {type(self.top_k).__name__}")
        if abs(self.top_k) > MAX_TOP_K:  # the sampler holds top_k in an int64 tensor
            raise ValueError(
                f"SamplingParams.top_k must be at most {MAX_TOP_K} (any value >= the vocabulary size "
                f"keeps every token), got {self.top_k}"
            )
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise TypeError(f"SamplingParams.top_p must be a number, got {type(self.top_p).__name__}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise TypeError(f"SamplingParams.max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"SamplingParams.seed must be an int or None, got {type(self.seed).__name__}")
        stops = tuple(self.stop_token_ids)
        for token in stops:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"SamplingParams.stop_token_ids must be non-negative ints, got {token!r}")
        object.__setattr__(self, "stop_token_ids", stops)
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"SamplingParams.logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}"
            )
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_tensors(
    params: list[SamplingParams], device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (temperature fp32, top_k int64, top_p fp32) for ``processed_log_softmax``."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    return temperature, top_k, top_p


def token_logprobs(
    kernels, logits: torch.Tensor, params: list[SamplingParams], tokens: torch.Tensor, mode: str | None = None
) -> torch.Tensor:
    """Logprob of ``tokens[i]`` under row i's distribution: processed or raw per row's mode
    (or ``mode`` for every row). The trainer's recompute calls this same function."""
    modes = [mode or p.logprobs_mode for p in params]
    out = torch.empty(len(params), dtype=torch.float32, device=logits.device)
    processed_rows = [i for i, m in enumerate(modes) if m == "processed"]
    raw_rows = [i for i, m in enumerate(modes) if m == "raw"]
    if processed_rows and not raw_rows:
        temperature, top_k, top_p = sampling_tensors(params, logits.device)
        lp = kernels.processed_log_softmax(logits, temperature, top_k, top_p)
        return lp.gather(1, tokens.view(-1, 1)).view(-1)
    if raw_rows and not processed_rows:
        return kernels.log_softmax(logits).gather(1, tokens.view(-1, 1)).view(-1)
    if not params:
        return out
    for rows, fn in ((processed_rows, "processed"), (raw_rows, "raw")):
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        sub = token_logprobs(kernels, logits[index], [params[i] for i in rows], tokens[index], fn)
        out = out.index_put((index,), sub)
    return out
