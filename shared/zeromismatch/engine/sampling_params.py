"""Sampling parameters of one request, validated once at construction.

The semantics are the KernelSet's ``processed_log_softmax``: temperature -> top-k ->
top-p -> renormalise, with temperature 0 meaning greedy. ``logprobs_mode`` says which
logprob the engine reports for a sampled token: "processed" = the logprob under the
distribution the sampler actually drew from (what an RL objective needs, PipelineRL
fix 1 in S2), "raw" = the log_softmax of the unprocessed logits (vLLM V1's default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
