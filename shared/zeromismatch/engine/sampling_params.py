"""``SamplingParams`` and its limits, defined in ``kernels/sampling.py`` (beside the sampling math the
engine and the trainer share); importable from here, where they were first defined."""

from ..kernels.sampling import LOGPROBS_MODES, MAX_TOP_K, MIN_TEMPERATURE, SamplingParams

__all__ = ["LOGPROBS_MODES", "MAX_TOP_K", "MIN_TEMPERATURE", "SamplingParams"]
