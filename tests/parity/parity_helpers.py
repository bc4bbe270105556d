"""Shared pieces of the parity-chain tests: models, workloads, bitwise comparisons."""

from __future__ import annotations

import torch

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.llm import build_preset
from zeromismatch.parity import make_workload, run_engine_workload
from zeromismatch.train.logprobs import recompute_outputs

PRESETS = ["tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (preset, quant) pairs: FP8 for the DeepSeek family, NVFP4 for the Nemotron family (S1, S3)
QUANTIZED = [("tiny-deepseek-v3", "fp8"), ("tiny-nemotron-h", "nvfp4"), ("tiny-qwen3-moe", "fp8")]


def dtype_quant_grid(dtypes=tuple(DTYPES)) -> list[tuple[str, str, str | None]]:
    """The chain's (preset, activation dtype, quant) grid: every preset dense in each of ``dtypes``,
    then each ``QUANTIZED`` pair with bf16 activations (quantized weights run bf16 models)."""
    return [(p, d, None) for p in PRESETS for d in dtypes] + [(p, "bf16", q) for p, q in QUANTIZED]


SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, max_tokens=6)


def model(preset, kernels="aligned", dtype="fp32", quant=None, seed=0):
    return build_preset(preset, kernels, DTYPES[dtype], seed, quant)


def engine(m, kernels="aligned", **kwargs):
    config = dict(max_num_seqs=3, max_num_batched_tokens=24, prefill_chunk=7, block_size=8)
    config.update(kwargs)
    return LLM(m, kernels, **config)


def workload(seed=0, num_prompts=5, max_prompt_len=24, **sampling):
    return make_workload(seed, num_prompts, 512, max_prompt_len, {**SAMPLING, **sampling})


def rollout(llm, seed=0, **kwargs):
    return run_engine_workload(llm, workload(seed, **kwargs))


def logprobs_of(outputs) -> torch.Tensor:
    return torch.cat([torch.tensor(o.logprobs, dtype=torch.float32) for o in outputs])


def trainer_diff(m, outputs, **kwargs) -> tuple[bool, float]:
    """(bitwise equal, max |diff|) between the outputs' logprobs and the trainer's recompute."""
    trainer = torch.cat(recompute_outputs(m, outputs, **kwargs))
    rollout_lp = logprobs_of(outputs)
    diff = (trainer.double() - rollout_lp.double()).abs()
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return torch.equal(trainer, rollout_lp), float(diff.max())


def first_mismatch(check, seeds=range(6)):
    """The first seed for which ``check(seed)`` reports a difference (for inverse tests)."""
    for seed in seeds:
        if check(seed):
            return seed
    return None


def reference_sampling(**overrides) -> SamplingParams:
    return SamplingParams(**{**SAMPLING, "seed": 1, **overrides})
