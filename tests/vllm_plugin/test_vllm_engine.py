"""``VllmEngine`` (integrations/vllm/engine.py): a real vLLM as the RL loop's rollout engine.

Serving the plugin, vLLM gives the project engine's tokens and logprob bits on the same requests
(same seeds, or none), the same one-line errors on bad input, and, after a weight update, never a
prefix-cache block of another weight version. So an RL run that rolls out on vLLM is the run that
rolls out on the project engine, bit for bit: here with the Megatron learner, at lag 0 and at lag 8
over 20 steps, every step's kernel k3 exactly 0 and the final weights hash the same.

Run with ``make vllm-test``; each in-process vLLM start costs ~7-15 s on 2 cores.
"""

from __future__ import annotations

import json

import pytest
import torch

from zeromismatch.engine import LLM
from zeromismatch.kernels.sampling import SamplingParams
from zeromismatch.models import build_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHUNK_BUDGET = 16  # tokens per step: the 23- and 40-token prompts are chunk-prefilled
BLOCK = 16  # the RL loop's default kv_block_size (the CPU kernel's 32 is not needed by the plugin)


def _requests() -> tuple[list[list[int]], list[SamplingParams]]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (5, 23, 40, 9)]
    params = [
        SamplingParams(
            temperature=0.9, top_k=50, top_p=0.95, max_tokens=12, seed=100 + i, stop_token_ids=(3,)
        )
        for i in range(len(prompts))
    ]
    prompts.append([1, 2, 3, 4])
    params.append(SamplingParams(temperature=1.0, max_tokens=8))  # unseeded: each engine draws its seed
    return prompts, params


BAD_PROMPTS = [[], [10**6], [1, 2.5], "12"]  # empty, outside the vocabulary, not ints, not a list


def _project_engine(kernels: str = "aligned") -> LLM:
    model = build_model("tiny-qwen3", kernels=kernels, dtype=torch.float32, seed=0)
    return LLM(model, kernels=kernels, max_num_batched_tokens=CHUNK_BUDGET, block_size=BLOCK)


@pytest.fixture(scope="module")
def served():
    """One vLLM, driven through the sequence the tests read: a batch with bad requests, the batch's
    first prompt again (a prefix-cache hit), a partial weight update, the batch again, a refused
    min-p request, one more request."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.exceptions import VLLMValidationError

    from zeromismatch.integrations.vllm.engine import VllmEngine

    prompts, params = _requests()
    model = build_model("tiny-qwen3", kernels="aligned", dtype=torch.float32, seed=0)
    update = {
        name: tensor + 0.01 * torch.randn(tensor.shape, generator=torch.Generator().manual_seed(1))
        for name, tensor in model.state_dict_hf().items()
        if name.startswith("model.layers.0.")
    }
    record = {}
    with VllmEngine(model, max_num_batched_tokens=CHUNK_BUDGET, max_num_seqs=8, block_size=BLOCK) as engine:
        record["first"] = engine.generate(prompts + BAD_PROMPTS, params + [params[0]] * len(BAD_PROMPTS))
        record["again"] = engine.generate([prompts[2]], params[2])[0]
        record["update_returned"] = engine.update_weights(update)
        record["updated"] = engine.generate(prompts, params[:-1] + [SamplingParams(max_tokens=8, seed=5)])
        try:
            engine.llm.generate(
                [{"prompt_token_ids": [1, 2, 3]}], VllmSamplingParams(min_p=0.2, max_tokens=2), use_tqdm=False
            )
        except VLLMValidationError as err:
            record["min_p_error"] = str(err)
        record["after_refusal"] = engine.generate([prompts[0]], params[0])[0]
        record["cache_stats"] = engine.cache_stats()
    record.update(prompts=prompts, params=params, update=update)
    return record


def _same(a, b) -> bool:
    return a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.finish_reason == b.finish_reason


def test_vllm_engine_gives_the_project_engines_tokens_and_bits(served):
    prompts, params = served["prompts"], served["params"]
    reference = _project_engine().generate(prompts, params)
    outputs = served["first"][: len(prompts)]
    assert [len(o.token_ids) for o in outputs] and all(o.error is None for o in outputs)
    assert max(len(p) for p in prompts) > CHUNK_BUDGET  # (some prompts were chunk-prefilled)
    for ours, theirs in zip(outputs, reference):
        assert _same(ours, theirs), (ours.token_ids, theirs.token_ids)
        assert ours.weight_versions == [0] * len(ours.token_ids)


def test_project_engine_on_the_default_kernels_differs(served):
    """The inverse: another kernel set on the same weights gives other logprob bits."""
    prompts, params = served["prompts"], served["params"]
    reference = _project_engine("default").generate(prompts, params)
    assert not all(_same(a, b) for a, b in zip(served["first"][: len(prompts)], reference))


def test_vllm_engine_rejects_bad_requests_with_the_project_engines_errors(served):
    prompts, params = served["prompts"], served["params"]
    reference = _project_engine().generate(BAD_PROMPTS, [params[0]] * len(BAD_PROMPTS))
    outputs = served["first"][len(prompts) :]
    for ours, theirs in zip(outputs, reference):
        assert ours.finish_reason == theirs.finish_reason == "error"
        assert ours.error == theirs.error and ours.error


def test_weight_update_reaches_vllm_and_the_prefix_cache_keeps_versions_apart(served):
    """A partial update (layer 0 only) is merged like the project engine merges it; the prompt that
    hit the prefix cache before the update (its 40 tokens: two full blocks) does not after it."""
    prompts, params = served["prompts"], served["params"]
    assert served["again"].num_cached_tokens == 2 * BLOCK and _same(served["again"], served["first"][2])
    assert served["update_returned"] == []
    engine = _project_engine()
    engine.update_weights(served["update"])
    reference = engine.generate(prompts, params[:-1] + [SamplingParams(max_tokens=8, seed=5)])
    for ours, theirs in zip(served["updated"], reference):
        assert _same(ours, theirs)
        assert ours.weight_versions == [1] * len(ours.token_ids)
        assert ours.num_cached_tokens == 0
    assert not _same(served["updated"][0], served["first"][0])  # (the update changed what is served)
    assert served["cache_stats"] == {"prefix_cache_hits": 2, "stale_prefix_hits": 0}


def test_sampling_parameters_the_plugin_does_not_apply_are_refused_and_the_engine_serves_on(served):
    assert "does not apply min_p" in served["min_p_error"]
    assert _same(served["after_refusal"], served["updated"][0])


# ---- an RL run on vLLM ------------------------------------------------------------------------------


def _rl_config(lag: int, rollout_engine: str):
    from zeromismatch.rl.config import RLConfig

    # 40 SFT steps on one-digit sums: rewards vary within groups, so the policy moves (the IS weights
    # below are not all 1) and lag 8 really trains on stale episodes
    return RLConfig(
        env="arithmetic", model="tiny-qwen3", env_options={"max_digits": 1}, sft_steps=40, steps=20, lag=lag,
        prompts_per_step=4, group_size=4, trainer="megatron", rollout_engine=rollout_engine, seed=0,
        eval_size=8, eval_samples=0,
    )  # fmt: skip


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("time_")}


@pytest.mark.megatron
@pytest.mark.parametrize("lag", [0, 8])
def test_rl_on_vllm_with_the_megatron_learner_is_the_project_engines_run(tmp_path, lag):
    from zeromismatch.rl.loop import train

    summaries = {}
    for engine in ("vllm", "zeromismatch"):
        summaries[engine] = train(_rl_config(lag, engine), tmp_path / engine, quiet=True)
    on_vllm, on_project = _records(tmp_path / "vllm"), _records(tmp_path / "zeromismatch")
    assert len(on_vllm) == 20
    for record in on_vllm:
        assert record["kernel_k3_kl"] == 0.0 and record["kernel_identical"], record["step"]
    assert summaries["vllm"]["weights_sha256"] == summaries["zeromismatch"]["weights_sha256"]
    assert [_comparable(r) for r in on_vllm] == [_comparable(r) for r in on_project]
    # not vacuous: the policy moved, and at lag 8 episodes came from weights 8 versions old
    assert max(r["grad_norm_preclip"] for r in on_vllm) > 0
    assert max(r["policy_lag"] for r in on_vllm) == lag
    if lag:
        assert max(r["is_max"] for r in on_vllm) > 1.5


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-nemotron-h"])
@pytest.mark.parametrize("mode", ["keep", "wait", "abort"])
def test_inflight_updates_on_vllm_are_the_project_engines(tmp_path, mode, model):
    """Lag 1 with the next version landing after the batch's first engine step, requests in flight:
    "keep" (vLLM preempts and re-prefills them under the new weights; a hybrid's Mamba state is
    computed again from the prompt), "wait" (drained first), "abort" (generated again from their
    start). Each run on vLLM is the run on the project engine."""
    from zeromismatch.rl.loop import train

    config = _rl_config(1, "vllm").replace(
        model=model, trainer="zeromismatch", steps=5, inflight_update_at_token=1, update_mode=mode, lr=0.05
    )
    summaries = {engine: train(config.replace(rollout_engine=engine), tmp_path / engine, quiet=True)
                 for engine in ("vllm", "zeromismatch")}  # fmt: skip
    on_vllm, on_project = _records(tmp_path / "vllm"), _records(tmp_path / "zeromismatch")
    assert [r["inflight_update_at_step"] for r in on_vllm] == [None, 1, 1, 1, 1]  # (landed mid-batch)
    if mode == "abort":
        assert all(r["inflight_regenerated_requests"] > 0 for r in on_vllm[1:])
    for record in on_vllm:
        assert record["kernel_k3_kl"] == 0.0 and record["kernel_identical"], record["step"]
    assert summaries["vllm"]["weights_sha256"] == summaries["zeromismatch"]["weights_sha256"]
    assert [_comparable(r) for r in on_vllm] == [_comparable(r) for r in on_project]


# ---- zm parity --engine vllm ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "preset, dtype, kernels",
    [
        ("tiny-qwen3", "bf16", "aligned"),
        ("tiny-deepseek-v3", "bf16", "aligned"),
        pytest.param("tiny-qwen3", "fp32", "aligned-native", marks=pytest.mark.native),
        pytest.param("tiny-nemotron-h", "bf16", "aligned-native", marks=pytest.mark.native),
    ],
)
def test_zm_parity_on_vllm_is_exact(capsys, preset, dtype, kernels):
    """The parity harness's workload (staggered arrivals, a shared prefix, chunked prefill) through
    vLLM's step API, the plugin on the named kernel set and the trainer on the same; the inverse, the
    engine on another set than the trainer's, is not exact."""
    from zeromismatch.cli import main
    from zeromismatch.parity import run_parity

    rc = main(
        ["parity", "--model", preset, "--dtype", dtype, "--kernels", kernels, "--engine", "vllm", "--json"]
    )
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["engine"] == "vllm" and result["rollout_kernels"] == kernels
    assert result["identical"] and result["diff_max"] == 0.0 and result["informative_tokens"] == 128
    # (a hybrid runs without prefix caching on both engines: its state is not in the cached blocks)
    hybrid = preset == "tiny-nemotron-h"
    assert result["prefix_cache_hits"] == 0 if hybrid else result["prefix_cache_hits"] > 0
    if kernels == "aligned-native":  # the native plugin against the pure-torch trainer
        inverse = run_parity(preset, dtype=dtype, kernels="aligned", rollout_kernels=kernels, engine="vllm")
    else:
        inverse = run_parity(preset, dtype=dtype, rollout_kernels="default")
    assert not inverse["identical"]
