"""Shared pieces of the bisector tests: small configs, cached baselines, mixed kernel sets."""

from __future__ import annotations

import functools

from zeromismatch.bisect import KERNEL_OPS, BisectConfig, run_bisect
from zeromismatch.bisect.recorder import canonical_op
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.base import KernelSet

PRESETS = ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"]

# 2 sequences (prompts of 9 and 2 tokens at seed 0): chunked prefill, decodes, mixed steps
SMALL = dict(num_seqs=2, max_prompt_len=9, max_response_len=3)

# every op each family calls (processed logprobs, fp32, unquantized); paged_attention is
# the engine's entry point of "attention"
OPS_BY_PRESET = {
    "tiny-qwen3": {
        "linear",
        "row_parallel_linear",
        "rms_norm",
        "rope",
        "silu_mul",
        "attention",
        "lm_head",
        "processed_log_softmax",
    },
    "tiny-qwen3-moe": {
        "linear",
        "row_parallel_linear",
        "rms_norm",
        "rope",
        "attention",
        "moe_route",
        "moe_experts",
        "lm_head",
        "processed_log_softmax",
    },
    "tiny-deepseek-v3": {
        "linear",
        "row_parallel_linear",
        "rms_norm",
        "rope",
        "silu_mul",
        "attention",
        "moe_route",
        "moe_experts",
        "lm_head",
        "processed_log_softmax",
    },
    "tiny-nemotron-h": {
        "linear",
        "row_parallel_linear",
        "rms_norm",
        "gated_rms_norm",
        "causal_conv1d",
        "ssm_scan",
        "relu2",
        "attention",
        "moe_route",
        "moe_experts",
        "lm_head",
        "processed_log_softmax",
    },
}


def config(preset: str, rollout: str = "aligned", trainer: str = "aligned", **overrides) -> BisectConfig:
    return BisectConfig(preset, rollout, trainer, **{**SMALL, **overrides})


@functools.cache
def baseline(preset: str):
    """aligned vs aligned at SMALL, shared by the tests of one session (its trainer side is
    reused by the perturbation tests: it does not depend on the engine side)."""
    return run_bisect(config(preset))


def called_ops(result) -> tuple[set[str], set[str]]:
    """(ops the engine side called, ops the trainer side called), as named in the KernelSet."""
    return {r.op for r in result.rollout.records}, {r.op for r in result.trainer.records}


def last_layer_calling(result, op: str):
    """The last layer (engine execution order) where ``op`` is called: exercises attribution
    beyond layer 0, and the head for the head ops."""
    layers = [r.layer for r in result.rollout.records if canonical_op(r.op) == canonical_op(op)]
    return layers[-1]


def mixed_kernels(stock_ops: set[str]) -> KernelSet:
    """The aligned set with ``stock_ops`` taken from the default set: a backend with exactly
    those ops unaligned, as when one kernel of a new model has not been aligned yet. Passed
    to the bisector as an object (not registered: the registry stays as the suite found it)."""
    aligned, default = get_kernels("aligned"), get_kernels("default")

    def forward(op):
        source = default if op in stock_ops else aligned

        def method(self, *args, **kwargs):
            return getattr(source, op)(*args, **kwargs)

        return method

    namespace = {op: forward(op) for op in KERNEL_OPS}
    namespace["name"] = "aligned-but-" + "-".join(sorted(stock_ops))
    return type("MixedKernels", (KernelSet,), namespace)()
