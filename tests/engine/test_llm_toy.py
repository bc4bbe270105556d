"""Engine behaviour on the stand-in model: batching, chunking, preemption, prefix cache,
weight updates, bad input -- each compared bitwise against the trainer's recompute.

The toy model with ``invariant=True`` is row-independent, so every engine path must
reproduce the trainer's logprobs exactly; ``invariant=False`` (batched GEMMs) is the
inverse case and must not.
"""

import warnings

import pytest
import torch
from toy_model import ToyKernels, ToyModel

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.train.logprobs import compute_logprobs, recompute_outputs

PARAMS = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, max_tokens=10, seed=5)


def _prompts(n, seed=0, vocab=48, low=1, high=14):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n_,), generator=gen).tolist() for n_ in lengths]


def _engine(model, **kwargs):
    config = dict(max_num_seqs=4, max_num_batched_tokens=16, prefill_chunk=5, block_size=4)
    config.update(kwargs)
    return LLM(model, ToyKernels(), **config)


def _max_diff(model, outputs, **kwargs):
    trainer = recompute_outputs(model, outputs, **kwargs)
    return max(
        float((t - torch.tensor(o.logprobs, dtype=torch.float32)).abs().max())
        for o, t in zip(outputs, trainer)
    )


def _identical(model, outputs, **kwargs):
    trainer = recompute_outputs(model, outputs, **kwargs)
    return all(
        torch.equal(torch.tensor(o.logprobs, dtype=torch.float32), t) for o, t in zip(outputs, trainer)
    )


def test_generate_matches_trainer_bitwise_with_chunked_continuous_batching():
    model = ToyModel()
    outputs = _engine(model).generate(_prompts(7), PARAMS)
    assert all(len(o.token_ids) == 10 and o.finish_reason == "length" for o in outputs)
    assert all(o.weight_versions == [0] * 10 for o in outputs)
    assert _identical(model, outputs, micro_batch_size=3)
    assert _identical(model, outputs, max_tokens_per_micro_batch=40, order=[6, 5, 4, 3, 2, 1, 0])


def test_inverse_batched_toy_mismatches():
    model = ToyModel(invariant=False)
    outputs = _engine(model).generate(_prompts(7), PARAMS)
    assert _max_diff(model, outputs, micro_batch_size=3) > 0


def test_results_do_not_depend_on_engine_configuration():
    model = ToyModel()
    reference = _engine(model, max_num_seqs=1, prefill_chunk=None, max_num_batched_tokens=64).generate(
        _prompts(6), PARAMS
    )
    for config in ({"max_num_seqs": 6, "prefill_chunk": 3}, {"max_num_batched_tokens": 7, "block_size": 2}):
        other = _engine(model, **config).generate(_prompts(6), PARAMS)
        assert [o.token_ids for o in other] == [o.token_ids for o in reference]
        assert [o.logprobs for o in other] == [o.logprobs for o in reference]


def test_step_api_staggered_arrivals_and_stop_tokens():
    model = ToyModel()
    llm = _engine(model)
    prompts = _prompts(6, seed=3)
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=9, stop_token_ids=[7, 11])
    finished = {}
    for step in range(200):
        if step < len(prompts):
            llm.add_request(prompts[step], params, request_id=f"r{step}")
        for out in llm.step():
            if out.finished:
                finished[out.request_id] = out
        if step >= len(prompts) and not llm.has_unfinished():
            break
    assert len(finished) == 6
    outputs = [finished[f"r{i}"] for i in range(6)]
    for out in outputs:
        assert out.finish_reason in ("stop", "length")
        if out.finish_reason == "stop":
            assert out.token_ids[-1] in (7, 11)
    assert _identical(model, outputs)


def test_preemption_under_block_pressure_keeps_parity():
    model = ToyModel()
    llm = _engine(model, num_blocks=12, max_num_seqs=4, max_num_batched_tokens=32, prefill_chunk=None)
    outputs = llm.generate(_prompts(6, seed=4, low=8, high=14), PARAMS)
    assert all(len(o.token_ids) == 10 for o in outputs)
    assert llm.num_preemptions > 0 and not llm.has_unfinished()
    assert _identical(model, outputs)


def test_prefix_cache_hot_equals_cold_and_is_used():
    model = ToyModel()
    shared = list(range(1, 13))
    prompts = [shared + [20 + i] for i in range(4)]
    cold = _engine(model, enable_prefix_caching=False).generate(prompts, PARAMS)
    hot_engine = _engine(model)
    hot_engine.generate(prompts[:1], PARAMS)  # warm the cache
    hot = hot_engine.generate(prompts, PARAMS)
    assert hot_engine.prefix_cache_hits() > 0 and all(o.num_cached_tokens == 12 for o in hot)
    assert [o.logprobs for o in hot] == [o.logprobs for o in cold]


def _perturbed(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in model.state_dict_hf().items()}


def _recompute_per_version(outputs, weights_by_version):
    """Recompute each token with the weights of the version that sampled it; all must match."""
    for version, weights in weights_by_version.items():
        model = ToyModel()
        model.load_state_dict_hf(weights)
        recomputed = recompute_outputs(model, outputs)
        for out, lp in zip(outputs, recomputed):
            mask = torch.tensor(out.weight_versions) == version
            if not torch.equal(lp[mask], torch.tensor(out.logprobs, dtype=torch.float32)[mask]):
                return False
    return True


def _run_with_update(mode, versioned=True, recompute_kv=True):
    model = ToyModel()
    v0 = model.state_dict_hf()
    v1 = _perturbed(model)
    llm = _engine(model, prefix_cache_versioned=versioned)
    prompts = _prompts(5, seed=7)
    for i, prompt in enumerate(prompts):
        llm.add_request(prompt, PARAMS, request_id=str(i))
    outputs = {}
    for _ in range(4):
        for out in llm.step():
            outputs[out.request_id] = out
    for out in llm.update_weights(v1, mode=mode, recompute_kv=recompute_kv):
        outputs[out.request_id] = out
    while llm.has_unfinished():
        for out in llm.step():
            outputs[out.request_id] = out
    return [outputs[str(i)] for i in range(5)], {0: v0, 1: v1}, llm


def test_update_keep_records_versions_and_recomputes_per_version():
    outputs, weights, llm = _run_with_update("keep")
    versions = {v for o in outputs for v in o.weight_versions}
    assert versions == {0, 1} and llm.weight_version == 1
    assert all(o.weight_versions == sorted(o.weight_versions) for o in outputs)
    assert _recompute_per_version(outputs, weights)


def test_inverse_update_keep_with_stale_kv_matches_no_version():
    outputs, weights, _ = _run_with_update("keep", recompute_kv=False)
    assert not _recompute_per_version(outputs, weights)


def test_update_wait_drains_under_old_weights():
    outputs, weights, _ = _run_with_update("wait")
    assert all(o.weight_versions == [0] * 10 and o.finish_reason == "length" for o in outputs)
    assert _recompute_per_version(outputs, weights)


def test_update_abort_returns_partial_outputs():
    outputs, weights, llm = _run_with_update("abort")
    assert all(o.aborted and o.finished for o in outputs)
    assert any(o.token_ids for o in outputs)  # some request had sampled tokens before the abort
    assert all(0 < len(o.token_ids) < 10 for o in outputs if o.token_ids)
    assert _recompute_per_version(outputs, weights)
    again = llm.generate(_prompts(2, seed=8), PARAMS)
    assert all(o.weight_versions == [1] * 10 for o in again)


def test_prefix_cache_across_update_versioned_vs_unversioned():
    shared = list(range(1, 13))
    prompts = [shared + [30 + i] for i in range(3)]
    results = {}
    for versioned in (True, False):
        model = ToyModel()
        llm = _engine(model, prefix_cache_versioned=versioned)
        llm.generate(prompts, PARAMS)  # cache the shared prefix under version 0
        llm.update_weights(_perturbed(model), mode="wait")
        outputs = llm.generate(prompts, PARAMS)
        results[versioned] = (_identical(model, outputs), sum(o.num_cached_tokens for o in outputs))
    assert results[True] == (True, 0)  # never served version-0 state
    assert results[False][1] > 0 and results[False][0] is False  # stale reuse shows up as a diff


def test_raw_vs_processed_logprobs_shift_the_policy_ratio():
    model = ToyModel()
    prompts = _prompts(8, seed=11)
    raw = SamplingParams(temperature=0.7, top_p=0.8, max_tokens=10, seed=1, logprobs_mode="raw")
    processed = SamplingParams(temperature=0.7, top_p=0.8, max_tokens=10, seed=1, logprobs_mode="processed")
    out_raw = _engine(model).generate(prompts, raw)
    out_processed = _engine(model).generate(prompts, processed)
    assert [o.token_ids for o in out_raw] == [o.token_ids for o in out_processed]  # same draws
    trainer = recompute_outputs(model, out_processed)  # the trainer scores what the sampler drew from
    assert _identical(model, out_processed)

    def mean_ratio(outs):
        deltas = torch.cat([t - torch.tensor(o.logprobs) for o, t in zip(outs, trainer)])
        return float(torch.exp(deltas.double()).mean())

    assert mean_ratio(out_processed) == 1.0
    assert abs(mean_ratio(out_raw) - 1.0) > 0.05


@pytest.mark.parametrize(
    "prompt, error",
    [
        ([], "empty"),
        ([1, 2, 999], "outside the vocabulary"),
        ([-1], "outside the vocabulary"),
        (list(range(40)) * 4, "maximum context"),
        ("hello", "sequence of token ids"),
        ([1.5], "must be ints"),
    ],
)
def test_bad_prompt_gets_one_error_and_others_are_served(prompt, error):
    model = ToyModel()
    llm = _engine(model)
    with pytest.raises((ValueError, TypeError), match=error):
        llm.add_request(prompt, PARAMS)
    outputs = llm.generate([[1, 2, 3], prompt, [4, 5]], PARAMS)
    assert outputs[1].finish_reason == "error" and error in outputs[1].error
    assert len(outputs[0].token_ids) == 10 and len(outputs[2].token_ids) == 10
    assert _identical(model, [outputs[0], outputs[2]])


def test_bad_weight_update_is_rejected_and_engine_keeps_serving():
    model = ToyModel()
    llm = _engine(model)
    llm.add_request([1, 2, 3], PARAMS, request_id="a")
    llm.step()
    bad = {"wq": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="shape mismatch"):
        llm.update_weights(bad)
    with pytest.raises(ValueError, match="unknown weight names"):
        llm.update_weights({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="mode"):
        llm.update_weights({}, mode="later")
    assert llm.weight_version == 0
    while llm.has_unfinished():
        outputs = llm.step()
    assert outputs[0].token_ids and outputs[0].weight_versions == [0] * 10


def test_trainer_logprobs_are_differentiable():
    model = ToyModel()
    for tensor in model.params.values():
        tensor.requires_grad_(True)
    outputs = _engine(model).generate(_prompts(2), PARAMS)
    logprobs = compute_logprobs(
        model,
        [o.prompt_token_ids for o in outputs],
        [o.token_ids for o in outputs],
        PARAMS,
        requires_grad=True,
    )
    torch.cat(logprobs).sum().backward()
    assert model.params["lm_head"].grad is not None and model.params["wq"].grad.abs().sum() > 0


def test_prefix_cache_never_serves_another_versions_block_with_a_colliding_tag():
    """Regression (found by review): an engine past ten weight updates served a block cached under
    version 1 to a version-11 request whose first block differed in its first token."""
    model = ToyModel()
    llm = _engine(model, enable_prefix_caching=True, max_num_seqs=2)
    weights = model.state_dict_hf()
    llm.update_weights(weights)  # version 1
    llm.generate([[12, 5, 6, 7, 8]], PARAMS)  # registers the block [12, 5, 6, 7] under v1
    for _ in range(10):
        llm.update_weights(weights)
    assert llm.weight_version == 11
    out = llm.generate([[2, 5, 6, 7, 8]], PARAMS)[0]
    assert out.num_cached_tokens == 0 and llm.block_manager.stale_hits == 0


def test_prefix_caching_on_where_supported_and_a_refused_request_is_said():
    """None (the default) turns prefix caching on where the model supports it; an explicit True
    on a model that cannot (a hybrid's recurrent state) warns once instead of going quiet."""
    supported = ToyModel(invariant=True)
    unsupported = ToyModel(invariant=True)
    unsupported.supports_prefix_caching = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these may warn
        assert _engine(supported).enable_prefix_caching
        assert not _engine(supported, enable_prefix_caching=False).enable_prefix_caching
        assert not _engine(unsupported).enable_prefix_caching
        assert not _engine(unsupported, enable_prefix_caching=False).enable_prefix_caching
    with pytest.warns(UserWarning, match="enable_prefix_caching=True is ignored: ToyModel") as seen:
        llm = _engine(unsupported, enable_prefix_caching=True)
    assert len(seen) == 1 and seen[0].filename == __file__  # pointed at the LLM(...) call (in _engine)
    assert not llm.enable_prefix_caching
    outputs = llm.generate(_prompts(3), SamplingParams(max_tokens=3, seed=1))
    assert llm.prefix_cache_hits() == 0 and all(o.finish_reason == "length" for o in outputs)
