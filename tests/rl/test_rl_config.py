"""RLConfig: one clear error per bad field; the lag schedule is what the docs say."""

from __future__ import annotations

import pytest

from zeromismatch.rl import RLConfig


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("env", "chess", "RLConfig.env"),
        ("algo", "dpo", "RLConfig.algo"),
        ("lag", 65, "RLConfig.lag"),
        ("lag", -1, "RLConfig.lag"),
        ("steps", 0, "RLConfig.steps"),
        ("executor", "spark", "RLConfig.executor"),
        ("update_mode", "yolo", "RLConfig.update_mode"),
        ("group_size", 1, "RLConfig.group_size"),
        ("eval_samples", -1, "RLConfig.eval_samples"),
        # session 7: these used to pass and fail late (after the warm start), crash, or never fail
        ("lag", True, "RLConfig.lag"),
        ("steps", True, "RLConfig.steps"),
        ("micro_batch_size", 0, "RLConfig.micro_batch_size"),
        ("lr", float("nan"), "RLConfig.lr"),
        ("lr", "1e-3", "RLConfig.lr"),
        ("sft_lr", float("inf"), "RLConfig.sft_lr"),
        ("grad_clip", float("nan"), "RLConfig.grad_clip"),
        ("temperature", 0.0, "temperature"),
        ("temperature", -1.0, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_k", 2.5, "top_k"),
        ("logprobs_mode", "bogus", "logprobs_mode"),
        ("rollout_lm_head", "fp64", "RLConfig.rollout_lm_head"),
        ("algo_options", {"clip_eps": 0.2}, "RLConfig.algo_options"),
    ],
)
def test_bad_field_is_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**{field: value})


def test_unknown_field_in_dict_is_named():
    with pytest.raises(ValueError, match="unknown field"):
        RLConfig.from_dict({"env": "arithmetic", "learning_rate": 1.0})


@pytest.mark.parametrize("lag", [0, 1, 8, 64])
def test_lag_schedule(lag):
    config = RLConfig(lag=lag, steps=100)
    for batch in range(100):
        version = config.weight_version_for_batch(batch)
        assert batch - version == min(batch, lag)


def test_round_trip():
    config = RLConfig(env="tools", lag=8, algo="tis", algo_options={"cap": 2.0})
    assert RLConfig.from_dict(config.to_dict()) == config


def test_matching_algo_options_are_accepted():
    assert RLConfig(algo="grpo", algo_options={"clip_eps": 0.1}).algo_options == {"clip_eps": 0.1}


@pytest.mark.parametrize("algo", ["tis", "ppo_clip"])
def test_one_response_per_prompt_is_refused_for_every_group_baseline(algo):
    # tis and ppo_clip take group baselines too: at group_size 1 every advantage was 0 and nothing learned
    with pytest.raises(ValueError, match="RLConfig.group_size"):
        RLConfig(algo=algo, group_size=1)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rollout_engine": "sglang"}, "rollout_engine"),
        ({"rollout_kernels": "default"}, "rollout_kernels"),
        ({"kernels": "default"}, "kernels"),
        ({"kv_cache_dtype": "fp8_e4m3", "rollout_dtype": "bfloat16"}, "kv_cache_dtype"),
        ({"rollout_lm_head": "activation", "rollout_dtype": "bfloat16"}, "rollout_lm_head"),
        ({"rollout_quant": "fp8"}, "rollout_quant"),
    ],
)
def test_vllm_rollout_refuses_what_the_plugin_cannot_serve(changes, field):
    """Checked when the config is made (no vLLM is imported), naming the field; the plugin serves the
    aligned kernels, unquantized weights, an activation-dtype KV cache, an fp32 head
    (integrations/vllm/engine.py)."""
    changes = {"rollout_engine": "vllm", **changes}
    with pytest.raises(ValueError, match=f"RLConfig.{field}"):
        RLConfig(**changes)


def test_vllm_rollout_accepts_the_aligned_stack_of_every_plugin_family():
    for model in ("tiny-qwen3", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h"):
        for dtype in ("float32", "bfloat16"):
            assert RLConfig(rollout_engine="vllm", model=model, dtype=dtype).rollout_engine == "vllm"
