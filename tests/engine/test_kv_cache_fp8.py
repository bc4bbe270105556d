"""FP8 (e4m3) KV cache (``LLM(kv_cache_dtype="fp8_e4m3")``, vLLM's option): what the cache holds, how
far it moves the logprobs, step graphs, the unit scales across a weight update, bad input, and every
attention family (GQA, MoE, MLA, hybrid)."""

import pytest
import torch
from toy_model import ToyKernels, ToyModel

from zeromismatch.engine import LLM, SamplingParams
from zeromismatch.engine.runner import ModelRunner
from zeromismatch.kernels.quant import KV_CACHE_DTYPES, fp8_kv_roundtrip
from zeromismatch.models import TINY_PRESETS, build_model
from zeromismatch.models.batch import ModelCache
from zeromismatch.train.logprobs import recompute_outputs

FP8 = "fp8_e4m3"
BF16 = torch.bfloat16
SAMPLING = dict(temperature=1.0, top_k=40, top_p=0.9)
#: FP8 vs auto raw logprobs of the same tokens on tiny-qwen3 (bf16): measured max |diff| 0.025 (0.008 to
#: 0.025 over the four families); processed logprobs move more, as top-k/top-p sets shift
LOGPROB_BOUND = 0.1


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (int(torch.randint(3, 14, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]  # fmt: skip


def _llm(preset="tiny-qwen3", kv_cache_dtype=FP8, kernels="aligned", **kwargs):
    return LLM(
        preset, kernels, dtype=BF16, max_num_seqs=4, block_size=4, kv_cache_dtype=kv_cache_dtype, **kwargs
    )


def _generate(llm, prompts, max_tokens=6, seed=3, sampling=SAMPLING):
    outputs = llm.generate(prompts, SamplingParams(**sampling, max_tokens=max_tokens, seed=seed))
    assert all(o.finish_reason == "length" for o in outputs), [o.error for o in outputs]
    return outputs


def _logprobs(outputs):
    return torch.cat([torch.tensor(o.logprobs) for o in outputs])


def _representable(tensor):
    """Whether every value is an e4m3 value (with the unit scale): the roundtrip is the identity."""
    return torch.equal(fp8_kv_roundtrip(tensor, 1.0), tensor)


def _attention_layers(cache):
    return [i for i, k in enumerate(cache.k_cache) if k is not None]


def test_roundtrip_saturates_rounds_to_nearest_even_and_divides_by_the_scale():
    x = torch.tensor([480.0, 1e6, -1e6, 1.0625, 1.1875, -1.0625, 0.0], dtype=BF16)
    # past 448: saturated, not NaN (torch's own cast overflows); midpoints: to the even mantissa
    expected = torch.tensor([448.0, 448.0, -448.0, 1.0, 1.25, -1.0, 0.0], dtype=BF16)
    assert torch.equal(fp8_kv_roundtrip(x, 1.0), expected)
    assert torch.equal(fp8_kv_roundtrip(x, torch.tensor(1.0)), expected)
    got = fp8_kv_roundtrip(torch.tensor([2.125, 900.0], dtype=BF16), torch.tensor(2.0))
    assert got.dtype == BF16 and torch.equal(got, torch.tensor([2.0, 896.0], dtype=BF16))
    assert fp8_kv_roundtrip(x.half(), 1.0).dtype == torch.float16


def test_cached_kv_are_e4m3_values_with_fp8_and_not_with_auto():
    prompts = _prompts(4)
    fp8, auto = _llm(), _llm(kv_cache_dtype="auto")
    _generate(fp8, prompts)
    _generate(auto, prompts)
    cache = fp8.runner.cache
    assert cache.kv_cache_dtype == FP8 and auto.runner.cache.kv_cache_dtype == "auto"
    for i in _attention_layers(cache):
        for stored in (cache.k_cache[i], cache.v_cache[i]):
            assert stored.dtype == BF16 and stored.count_nonzero() > 0  # (written: not vacuous)
            assert _representable(stored)
    auto_cache = auto.runner.cache
    assert not any(_representable(auto_cache.k_cache[i]) for i in _attention_layers(auto_cache))
    assert not any(_representable(auto_cache.v_cache[i]) for i in _attention_layers(auto_cache))


def _common_prefix_logprobs(outputs_a, outputs_b):
    """Each request's logprobs up to where the two runs' tokens part (the contexts agree there)."""
    a, b = [], []
    for x, y in zip(outputs_a, outputs_b):
        n = 0
        while n < len(x.token_ids) and x.token_ids[n] == y.token_ids[n]:
            n += 1
        n = min(n + 1, len(x.token_ids))  # the first differing token's logprob had the same context
        a.extend(x.logprobs[:n])
        b.extend(y.logprobs[:n])
    return torch.tensor(a), torch.tensor(b)


def test_fp8_logprobs_move_slightly_and_break_the_trainers_bits():
    prompts = _prompts(8, seed=1)
    fp8, auto = _llm(), _llm(kv_cache_dtype="auto")
    raw = dict(temperature=1.0, logprobs_mode="raw")  # the model's own distribution
    fp8_out, auto_out = _generate(fp8, prompts, sampling=raw), _generate(auto, prompts, sampling=raw)
    got, ref = _common_prefix_logprobs(fp8_out, auto_out)
    assert got.numel() >= 8
    diff = (got - ref).abs()
    assert diff.max() > 0  # the rounding reaches the logprobs
    assert diff.max() < LOGPROB_BOUND  # ... and only perturbs them
    # the trainer has no cache: it recomputes the auto engine's bits, not the FP8 engine's
    assert torch.equal(torch.cat(recompute_outputs(auto.model, auto_out)), _logprobs(auto_out))
    assert not torch.equal(torch.cat(recompute_outputs(fp8.model, fp8_out)), _logprobs(fp8_out))


@pytest.mark.native
@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-deepseek-v3", "tiny-nemotron-h"])
def test_step_graphs_replay_the_fp8_rounding_bit_for_bit(preset):
    prompts = _prompts(4, seed=2)
    lengths = (6, 9, 12, 15)  # requests leave at different steps: several graph keys, runs of replays
    params = [SamplingParams(**SAMPLING, max_tokens=m, seed=5) for m in lengths]
    graphed = _llm(preset, kernels="aligned-native")
    eager = _llm(preset, kernels="aligned-native", enforce_eager=True)
    graphed_out, eager_out = graphed.generate(prompts, params), eager.generate(prompts, params)
    stats = graphed.runner.graphs.stats()
    assert stats["enabled"] and stats["captures"] >= 2 and stats["replays"] >= 5, stats
    assert eager.runner.graphs.stats()["replays"] == 0
    assert [o.token_ids for o in graphed_out] == [o.token_ids for o in eager_out]
    assert torch.equal(_logprobs(graphed_out), _logprobs(eager_out))
    for i in _attention_layers(graphed.runner.cache):
        assert torch.equal(graphed.runner.cache.k_cache[i], eager.runner.cache.k_cache[i])
        assert _representable(graphed.runner.cache.v_cache[i])


def _scales(cache):
    return [s for i in _attention_layers(cache) for s in (cache.k_scale[i], cache.v_scale[i])]


def test_scales_stay_one_across_a_weight_update_and_match_a_fresh_engine():
    llm = _llm(seed=0)
    _generate(llm, _prompts(3))
    scales = _scales(llm.runner.cache)
    one = torch.ones((), dtype=torch.float32)
    assert scales and all(s.dtype == torch.float32 and torch.equal(s, one) for s in scales)
    new = build_model("tiny-qwen3", kernels="aligned", dtype=BF16, seed=11)
    llm.update_weights(new.state_dict_hf())
    assert all(torch.equal(s, one) for s in _scales(llm.runner.cache))
    prompt = _prompts(1, seed=9)
    updated = _generate(llm, prompt)[0]
    fresh = _generate(_llm(new), prompt)[0]
    assert updated.weight_versions == [1] * len(updated.token_ids)
    assert updated.token_ids == fresh.token_ids
    assert torch.equal(torch.tensor(updated.logprobs), torch.tensor(fresh.logprobs))
    llm.runner.reset_cache()  # a fresh cache keeps the dtype and the unit scales
    assert llm.runner.cache.fp8 and all(torch.equal(s, one) for s in _scales(llm.runner.cache))


def test_bad_kv_cache_dtypes_raise_one_clear_error_before_any_cache(monkeypatch):
    from zeromismatch.models.causal_lm import CausalLM

    def no_cache(*args, **kwargs):
        raise AssertionError("a cache was allocated before kv_cache_dtype was checked")

    monkeypatch.setattr(CausalLM, "allocate_cache", no_cache)
    for bad in ("fp8", "fp8_e5m2", None):
        with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'fp8_e4m3'\)"):
            _llm(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match=r"needs a bfloat16 or float16 model, got torch.float32.*fp16/bf16"):
        LLM("tiny-qwen3", "aligned", kv_cache_dtype=FP8)
    fp32_model = build_model("tiny-deepseek-v3", kernels="aligned", dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="got torch.float32"):
        LLM(fp32_model, "aligned", kv_cache_dtype=FP8)
    # one error from the proxy, before any worker is spawned
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM("tiny-qwen3", "aligned", tp=2, dtype=BF16, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="got torch.float32"):
        LLM("tiny-qwen3", "aligned", tp=2, kv_cache_dtype=FP8)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="got torch.float32"):
        fp32_model.allocate_cache(2, 4, 1, kv_cache_dtype=FP8)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        fp32_model.allocate_cache(2, 4, 1, kv_cache_dtype="e4m3")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        ModelCache(block_size=4, num_blocks=2, kv_cache_dtype="fp8_e5m2")
    assert KV_CACHE_DTYPES == ("auto", FP8)


def test_a_model_object_without_fp8_support_is_refused_not_run_unrounded():
    class Ignores(ToyModel):  # takes the argument and builds an "auto" cache anyway
        def allocate_cache(self, num_blocks, block_size, max_seqs, dtype=None, kv_cache_dtype="auto"):
            return super().allocate_cache(num_blocks, block_size, max_seqs, dtype)

    with pytest.raises(ValueError, match="Ignores.allocate_cache returned a 'auto' cache"):
        ModelRunner(Ignores(), ToyKernels(), 4, 4, 2, kv_cache_dtype=FP8)
    with pytest.raises(ValueError, match="needs a model with a torch dtype"):
        LLM(ToyModel(), ToyKernels(), kv_cache_dtype=FP8)  # (no dtype to check the fp16/bf16 rule on)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_every_family_rounds_its_attention_kv_and_nothing_else(preset):
    """Prefill only (one sampled token, which is not cached): the first attention layer's K/V come
    from unrounded layers, so the FP8 cache holds exactly the auto cache's values rounded; Mamba2
    conv/SSM state before it is the auto engine's, and no state is rounded."""
    prompts = _prompts(3, seed=4)
    fp8, auto = _llm(preset), _llm(preset, kv_cache_dtype="auto")
    _generate(fp8, prompts, max_tokens=1)
    _generate(auto, prompts, max_tokens=1)
    decoded = _llm(preset)  # and with decode steps
    _generate(decoded, prompts, max_tokens=5)
    assert all(
        _representable(decoded.runner.cache.v_cache[i]) for i in _attention_layers(decoded.runner.cache)
    )
    cache, ref = fp8.runner.cache, auto.runner.cache
    attention = _attention_layers(cache)
    first = attention[0]
    assert torch.equal(cache.k_cache[first], fp8_kv_roundtrip(ref.k_cache[first], 1.0))
    assert torch.equal(cache.v_cache[first], fp8_kv_roundtrip(ref.v_cache[first], 1.0))
    assert not torch.equal(cache.k_cache[first], ref.k_cache[first])
    for i in range(len(cache.k_cache)):
        has_scales = cache.k_scale[i] is not None and cache.v_scale[i] is not None
        assert has_scales == (i in attention)
        if cache.ssm_state[i] is not None:
            if i < first:
                assert torch.equal(cache.ssm_state[i], ref.ssm_state[i])
                assert torch.equal(cache.conv_state[i], ref.conv_state[i])
            assert cache.ssm_state[i].dtype == torch.float32
            assert not _representable(cache.ssm_state[i]) and not _representable(cache.conv_state[i])
    assert all(k is None for k in ref.k_scale + ref.v_scale)


@pytest.mark.slow
def test_tensor_parallel_engine_takes_the_fp8_cache_too():
    prompts = _prompts(3, seed=6)
    single = _generate(_llm(), prompts, max_tokens=4)
    auto = _generate(_llm(kv_cache_dtype="auto"), prompts, max_tokens=4)
    assert not torch.equal(_logprobs(single), _logprobs(auto))  # (so the workers' cache is told apart)
    with _llm(tp=2) as llm:
        sharded = _generate(llm, prompts, max_tokens=4)
    assert [o.token_ids for o in sharded] == [o.token_ids for o in single]
    assert torch.equal(_logprobs(sharded), _logprobs(single))
