"""Rollout throughput: engine aligned ÷ default, and engine (aligned) ÷ HF ``generate``.

One run measures all three side by side on the same weights and the same prompts:
- ``engine-aligned`` and ``engine-default``: ``zeromismatch.engine.LLM`` with the aligned
  and the default kernel sets (continuous batching, all prompts admitted at once);
- ``engine-aligned-native``: the same engine with the aligned-native set (the aligned set with
  its hot ops in fixed-order C, kernels/native), when a C compiler is available
  (``--no-native`` skips it);
- ``engine-fast-native``: the same engine with the fast-native set (kernels/fast_native.py: the
  unaligned baseline of equal effort, step graphs on, the fastest op per call, batch-variant),
  with aligned-native: ``ratio_aligned_native_over_fast_native`` is the like-for-like cost of
  alignment (same engine features on both sides);
- ``hf-generate``: Hugging Face transformers ``generate`` on a model built from the same
  config and loaded with the same HF state dict (``state_dict_hf``), left-padded batch,
  ``do_sample=True`` with the same temperature, ``top_k=0``, fixed ``max_new_tokens``
  (``min_new_tokens`` too, so no request stops early).
Each repetition runs the three in rotating order; tokens/s = generated tokens / wall
seconds, and the reported ratios are ratios of the per-system *medians*. Each run also records
its process CPU seconds and minor page faults: fresh multi-MB temporaries are page-faulted in
on first touch, and how often that happens depends on the allocator's state (e.g. whether the
HF model ran in the same process), which moves the wall-clock numbers by tens of percent. The published
reference, 0.913 (S1), is judged on aligned-native ÷ fast-native; this script makes no claim about
GPUs.

Usage: ``python benchmarks/rollout.py [--model tiny-qwen3] [--dtype fp32] [--quant fp8-block]
[--batch 32] [--new-tokens 128] [--repeats 5] [--threads 1] [--no-native] [--no-hf] [--quiet]
[--out results/reproduced/benchmarks/rollout.json]``;
it prints the ratios and writes JSON only with ``--out`` (``make bench`` and
``scripts/reproduce_mini.py`` pass it)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from zeromismatch._provenance import provenance
from zeromismatch.argtypes import check_out_or_exit, float_at_least, int_at_least
from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.llm import build_preset
from zeromismatch.io import atomic_write_json
from zeromismatch.kernels.native import unavailable_reason as native_unavailable_reason
from zeromismatch.models.quantized import QUANT_FORMATS as WEIGHT_FORMATS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: new tokens of the untimed warm-up generate: enough decode steps for a step-graph capture
#: (engine/step_graphs.py: one eager warm-up step per key, then the capture)
WARM_UP_TOKENS = 4


def make_prompts(batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (prompt_len,), generator=gen).tolist() for _ in range(batch)]


def usage_since(before) -> dict:
    """Process CPU seconds (user + system) and minor page faults since ``before`` (a getrusage)."""
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
    }


def make_engine(model, kernels: str, prompts, enforce_eager: bool = False) -> LLM:
    """The engine the rollout workload runs on: every prompt admitted at once, no prefix caching;
    decode steps replay step graphs where the kernel set allows (engine/step_graphs.py)."""
    return LLM(
        model,
        kernels,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=max(2048, sum(map(len, prompts))),
        enable_prefix_caching=False,
        block_size=16,
        enforce_eager=enforce_eager,
    )


def check_outputs(outputs, new_tokens: int) -> None:
    """A timed generate must have produced every token: a request that ended in an engine error
    would make the run shorter and its tokens/s meaningless (found in review: an instrumented run
    whose steps failed reported 3 steps)."""
    for output in outputs:
        if output.finish_reason == "error" or len(output.token_ids) != new_tokens:
            raise RuntimeError(
                f"request {output.request_id} ended {output.finish_reason!r} after {len(output.token_ids)} "
                f"of {new_tokens} tokens: {output.error or 'no error message'}"
            )


def time_engine(model, kernels: str, prompts, new_tokens: int, temperature: float) -> tuple[float, int, dict]:
    llm = make_engine(model, kernels, prompts)
    params = SamplingParams(temperature=temperature, max_tokens=new_tokens, seed=1)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    check_outputs(outputs, new_tokens)
    usage = {**usage_since(before), "step_graphs": llm.runner.graphs.stats()}
    return elapsed, sum(len(o.token_ids) for o in outputs), usage


def build_hf_model(model, dtype: torch.dtype):
    """The transformers model of the same weights: our checkpoint written with ``save_pretrained``
    and read back by ``from_pretrained`` (so transformers applies its own checkpoint-key
    conversions, e.g. Nemotron-H's ``backbone.`` prefix and per-expert weights), with every
    checkpoint tensor required to load."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from zeromismatch.models.loader import save_pretrained

    with tempfile.TemporaryDirectory() as checkpoint:
        save_pretrained(model, checkpoint)
        hf, info = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, output_loading_info=True)
    # rotary inv_freq buffers are recomputed by transformers and not part of the checkpoint
    missing = [m for m in info["missing_keys"] if "rotary_emb" not in m]
    unexpected = list(info["unexpected_keys"])
    if missing or unexpected:
        raise ValueError(
            f"HF model does not match the state dict: missing {missing}, unexpected {unexpected}"
        )
    return hf.eval()


def hf_logits_gap(model, hf, prompt: list[int]) -> float:
    """max |logit| difference between our model (trainer mode) and the HF model on one prompt:
    evidence that both run the same weights (different kernels, so not bitwise)."""
    from zeromismatch.models import ForwardBatch

    with torch.no_grad():
        ours = model.compute_logits(model(ForwardBatch.for_training([torch.tensor(prompt)]), None))
        theirs = hf(input_ids=torch.tensor([prompt])).logits[0].float()
    return float((ours - theirs).abs().max())


def time_hf(hf, prompts, new_tokens: int, temperature: float) -> tuple[float, int, dict]:
    ids = torch.tensor(prompts, dtype=torch.int64)  # equal-length prompts: no padding needed
    mask = torch.ones_like(ids)
    torch.manual_seed(1)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )
    elapsed = time.perf_counter() - start
    return elapsed, int((out.shape[1] - ids.shape[1]) * ids.shape[0]), usage_since(before)


def run_rotating(timers: dict, repeats: int, quiet: bool = False) -> tuple[dict, dict, dict]:
    """Time each system ``repeats`` times in rotating order (machine noise hits all of them);
    ``timers[name]()`` returns (seconds, tokens, usage). Returns the runs and the per-system
    medians of tokens per wall second and per CPU second (on a shared machine, waiting for a
    core inflates wall time, not CPU time)."""
    systems = list(timers)
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    for rep in range(repeats):
        for name in systems[rep % len(systems) :] + systems[: rep % len(systems)]:
            seconds, tokens, usage = timers[name]()
            rate = tokens / seconds
            runs[name].append({"seconds": seconds, "tokens": tokens, "tokens_per_s": rate, **usage})
            if not quiet:
                print(
                    f"rep {rep} {name:15s} {tokens} tokens in {seconds:.3f} s = {rate:.1f} tok/s "
                    f"(cpu {usage['cpu_seconds']:.3f} s, {usage['minor_page_faults']} page faults)"
                )
    medians = {name: statistics.median(r["tokens_per_s"] for r in runs[name]) for name in systems}
    cpu_medians = {
        name: statistics.median(r["tokens"] / r["cpu_seconds"] for r in runs[name]) for name in systems
    }
    return runs, medians, cpu_medians


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The rollout workload's options (model, dtype, batch, lengths, sampling, repeats, seed), shared
    with ``rollout_breakdown.py`` so both measure the same workload by default."""
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--batch", type=int_at_least(1), default=32)
    parser.add_argument("--prompt-len", type=int_at_least(1), default=16)
    parser.add_argument("--new-tokens", type=int_at_least(1), default=128)
    parser.add_argument("--temperature", type=float_at_least(0.0), default=1.0)
    parser.add_argument("--repeats", type=int_at_least(1), default=5)
    parser.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument(
        "--threads",
        type=int_at_least(1),
        default=1,
        help="torch threads for all systems (1 default: on a shared machine, OpenMP barriers under "
        "oversubscription stall multi-threaded runs far more than they speed them up)",
    )
    parser.add_argument(
        "--quant",
        choices=WEIGHT_FORMATS,
        default=None,
        help="rollout weight format on every engine system (the same quantized weights on each); "
        "the transformers baseline is not run with it",
    )
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--no-native", action="store_true", help="skip the aligned-native kernel set")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition lines")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)  # before any measuring
    from zeromismatch.models.presets import PRESETS

    if args.model not in PRESETS:
        parser.error(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    model = build_preset(args.model, "aligned", dtype, args.seed, args.quant)
    prompts = make_prompts(args.batch, args.prompt_len, int(model.config.vocab_size), args.seed)
    native_not_run = "--no-native" if args.no_native else native_unavailable_reason()
    native = native_not_run is None
    if native_not_run and not args.no_native:
        print(f"rollout.py: engine-aligned-native not run: {native_not_run}", file=sys.stderr)
    systems = ["engine-aligned", "engine-default"]
    systems += ["engine-aligned-native", "engine-fast-native"] if native else []
    run_hf = not (args.no_hf or args.quant)
    systems += ["hf-generate"] if run_hf else []
    hf = build_hf_model(model, dtype) if run_hf else None
    # warm-up (allocator, lazy inits, the native library's build, and a step-graph capture: the
    # process's first imports torch._dynamo, ~1 s) -- not timed
    for name in systems:
        if name.startswith("engine-"):
            time_engine(model, name.split("-", 1)[1], prompts[:2], WARM_UP_TOKENS, args.temperature)

    def engine_timer(kernels: str):
        def timer():
            timing = time_engine(model, kernels, prompts, args.new_tokens, args.temperature)
            model.set_kernels("aligned")
            return timing

        return timer

    timers = {name: engine_timer(name.split("-", 1)[1]) for name in systems if name != "hf-generate"}
    if hf is not None:
        timers["hf-generate"] = lambda: time_hf(hf, prompts, args.new_tokens, args.temperature)
    runs, medians, cpu_medians = run_rotating(timers, args.repeats, args.quiet)
    result = {
        "benchmark": "rollout",
        "config": vars(args),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": list(os.getloadavg()),
        "runs": runs,
        "median_tokens_per_s": medians,
        "ratio_aligned_over_default": medians["engine-aligned"] / medians["engine-default"],
        "median_tokens_per_cpu_s": cpu_medians,
        "ratio_aligned_over_default_cpu": cpu_medians["engine-aligned"] / cpu_medians["engine-default"],
        "targets": {"aligned_over_default": 0.95, "engine_over_hf": 3.0},
        "provenance": provenance(config=vars(args)),
    }
    if args.quant:
        result["hf_not_run"] = f"--quant {args.quant}: transformers serves the unquantized checkpoint"
    if not native:
        result["native_not_run"] = native_not_run
    else:
        result["ratio_aligned_native_over_default"] = (
            medians["engine-aligned-native"] / medians["engine-default"]
        )
        result["ratio_aligned_native_over_default_cpu"] = (
            cpu_medians["engine-aligned-native"] / cpu_medians["engine-default"]
        )
        result["ratio_aligned_native_over_fast_native"] = (
            medians["engine-aligned-native"] / medians["engine-fast-native"]
        )
        result["ratio_aligned_native_over_fast_native_cpu"] = (
            cpu_medians["engine-aligned-native"] / cpu_medians["engine-fast-native"]
        )
    if hf is not None:
        result["hf_same_weights_max_abs_logit_diff"] = hf_logits_gap(model, hf, prompts[0])
        result["ratio_engine_aligned_over_hf"] = medians["engine-aligned"] / medians["hf-generate"]
        aligned_cpu, hf_cpu = cpu_medians["engine-aligned"], cpu_medians["hf-generate"]
        result["ratio_engine_aligned_over_hf_cpu"] = aligned_cpu / hf_cpu
        if native:
            result["ratio_engine_aligned_native_over_hf"] = (
                medians["engine-aligned-native"] / medians["hf-generate"]
            )
            result["ratio_engine_aligned_native_over_hf_cpu"] = cpu_medians["engine-aligned-native"] / hf_cpu
    if args.out:
        atomic_write_json(Path(args.out), result)
    print({k: v for k, v in result.items() if k.startswith("ratio") or k == "median_tokens_per_s"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
