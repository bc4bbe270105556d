"""vLLM-shaped rollout engine whose token logprobs match the trainer's recompute bitwise.

Layers: request types (request.py, sampling_params.py) -> scheduler.py (continuous
batching, chunked prefill) -> kv_cache.py (paged blocks, version-keyed prefix cache)
-> runner.py (packed forward; step_graphs.py replays captured decode steps, as vLLM
replays CUDA graphs) -> sampler.py (one sampling definition, per-request seeds) ->
llm.py (``LLM``: generate, step API, update_weights), tp.py (tensor parallel engine in
spawned gloo workers).
"""

from ..kernels.sampling import SamplingParams
from .llm import LLM
from .request import Request, RequestOutput, RequestStatus
from .weights import UPDATE_MODES

__all__ = ["LLM", "UPDATE_MODES", "Request", "RequestOutput", "RequestStatus", "SamplingParams"]
