"""The four PipelineRL fixes (S2) as explicit engine options; each test shows the failure
the fix prevents (on tiny-qwen3, aligned kernels, so the fix is the only variable)."""

import torch
from parity_helpers import engine, logprobs_of, model, rollout, trainer_diff, workload
from test_parity_updates import new_weights, per_version_equal, run_with_update

from zeromismatch.train.logprobs import recompute_outputs

PRESET = "tiny-qwen3"


def test_fix1_processed_logprobs_keep_the_mean_ratio_at_one():
    m = model(PRESET)
    sampling = dict(temperature=0.7, top_p=0.8, top_k=0, max_tokens=8)
    processed = rollout(engine(m), seed=8, logprobs_mode="processed", **sampling)
    raw = rollout(engine(m), seed=8, logprobs_mode="raw", **sampling)
    assert [o.token_ids for o in raw] == [o.token_ids for o in processed]  # same draws, other reporting
    trainer = torch.cat(recompute_outputs(m, processed))  # the trainer scores the sampling distribution

    def mean_ratio(outputs):
        return float(torch.exp(trainer.double() - logprobs_of(outputs).double()).mean())

    assert mean_ratio(processed) == 1.0
    assert abs(mean_ratio(raw) - 1.0) > 0.05  # raw logprobs push the mean policy ratio off 1.0


def _prefix_cache_after_update(versioned: bool):
    m = model(PRESET)
    llm = engine(m, prefix_cache_versioned=versioned)
    rollout(llm, seed=9, num_prompts=6)  # caches the shared prefix under version 0
    llm.update_weights(new_weights(m), mode="wait")
    outputs = rollout(llm, seed=9, num_prompts=6)
    return trainer_diff(m, outputs), sum(o.num_cached_tokens for o in outputs), llm.block_manager.stale_hits


def test_fix2_prefix_cache_keyed_by_weight_version():
    (equal, diff), cached, stale = _prefix_cache_after_update(versioned=True)
    assert equal and diff == 0.0 and cached == 0 and stale == 0
    (equal, diff), cached, stale = _prefix_cache_after_update(versioned=False)
    assert cached > 0 and not equal and diff > 0  # stale version-0 K/V served after the update
    assert stale > 0  # and the engine's own counter says so


def test_fix3_in_flight_update_mode():
    m = model(PRESET)
    weights = {0: m.state_dict_hf(), 1: new_weights(m)}
    items = workload(0, num_prompts=4, max_tokens=6)
    stale = run_with_update(engine(m), items, weights[1], "keep", recompute_kv=False)
    assert any(set(o.weight_versions) == {0, 1} for o in stale)
    assert not per_version_equal(PRESET, "aligned", stale, weights)  # matches no single version
    recomputed = run_with_update(engine(model(PRESET)), items, weights[1], "keep")  # wait/abort: link 6
    assert per_version_equal(PRESET, "aligned", recomputed, weights)


def test_fix4_fp32_lm_head():
    m = model(PRESET, dtype="bf16")
    fp32_head = rollout(engine(m, lm_head_precision="fp32"), seed=10)
    assert trainer_diff(m, fp32_head) == (True, 0.0)
    bf16_head = rollout(engine(m, lm_head_precision="activation"), seed=10)
    equal, diff = trainer_diff(m, bf16_head)  # trainer: fp32 head
    assert not equal and diff > 0
