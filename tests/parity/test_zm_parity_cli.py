"""``zm parity`` through the CLI entry point: JSON output and a clear error on bad input."""

import json

import pytest
import torch
from parity_helpers import QUANTIZED, first_mismatch

from zeromismatch.cli import main


def test_zm_parity_json(capsys):
    rc = main(["parity", "--model", "tiny-qwen3", "--num-prompts", "3", "--max-tokens", "3", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["identical"] and result["tokens"] == 9
    assert [result[k] for k in ("diff_max", "diff_mean", "diff_std", "k3_kl")] == [0.0] * 4


def test_zm_parity_text_and_bad_input(capsys):
    rc = main(["parity", "--model", "tiny-qwen3", "--num-prompts", "2", "--max-tokens", "2"])
    text = capsys.readouterr().out
    assert rc == 0 and "diff_max" in text and "identical  True" in text
    rc = main(["parity", "--model", "tiny-qwen3", "--top-p", "1.5"])
    assert rc == 2 and "top_p" in capsys.readouterr().err


def test_zm_parity_rejects_bad_tp_and_prompt_count_before_spawning(capsys, monkeypatch):
    import zeromismatch.engine.tp as engine_tp

    monkeypatch.setattr(engine_tp, "run_spmd", lambda *a, **k: pytest.fail("spawned workers"))
    cases = [
        (["--tp", "3"], "--tp 3 must divide"),
        (["--tp", "4"], "num_key_value_heads"),  # tiny-qwen3 has 2 KV heads
        (["--tp", "64"], "--tp 64 must divide"),
        (["--trainer-tp", "3"], "--trainer-tp 3 must divide"),
        (["--trainer-tp", "0"], "--trainer-tp must be >= 1"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
        # quantized weights are not sharded: refused before any rollout, for either side
        (["--quant", "fp8", "--tp", "2"], "--quant fp8 runs at TP 1 only"),
        (["--quant", "nvfp4", "--trainer-tp", "2"], "--quant nvfp4 runs at TP 1 only"),
    ]
    for extra, message in cases:
        rc = main(["parity", "--model", "tiny-qwen3", "--max-tokens", "2", *extra])
        captured = capsys.readouterr()
        assert rc == 2 and message in captured.err, (extra, captured.err)
    # every family the project has is served, the hybrid too (its Mamba2 state in vLLM's Mamba cache)
    from zeromismatch.integrations.vllm import serving_problems
    from zeromismatch.models.presets import PRESETS

    for preset in sorted({v["model_type"]: name for name, v in PRESETS.items()}.values()):
        assert serving_problems(preset, "aligned", "none", "auto", "fp32") == [], preset


def test_zm_parity_prefill_chunk_none_means_no_per_request_limit(capsys):
    rc = main(
        [
            "parity",
            "--model",
            "tiny-qwen3",
            "--num-prompts",
            "2",
            "--max-tokens",
            "2",
            "--prefill-chunk",
            "none",
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["prefill_chunk"] is None and result["identical"]
    with pytest.raises(SystemExit):  # argparse: exit 2 with one message
        main(["parity", "--model", "tiny-qwen3", "--prefill-chunk", "0"])
    assert "must be >= 1" in capsys.readouterr().err


def test_tensor_parallel_llm_refuses_quantization_before_spawning(monkeypatch):
    import zeromismatch.engine.tp as engine_tp

    monkeypatch.setattr(engine_tp.mp, "get_context", lambda *a: pytest.fail("spawned workers"))
    with pytest.raises(ValueError, match="cannot quantize"):
        engine_tp.TensorParallelLLM("tiny-qwen3", "aligned", tp=2, quant="fp8")


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--top-k", "1"]])
def test_zm_parity_refuses_a_comparison_that_would_pass_on_any_kernels(capsys, sampling):
    # processed logprobs are then all exactly 0: the default kernels used to print "identical True"
    rc = main(["parity", "--model", "tiny-qwen3", "--kernels", "default", "--num-prompts", "2", *sampling])
    assert rc == 2 and "--logprobs-mode raw" in capsys.readouterr().err
    rc = main(["parity", "--model", "tiny-qwen3", "--kernels", "default", "--num-prompts", "5",
               "--max-tokens", "5", "--logprobs-mode", "raw", "--json", *sampling])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["informative_tokens"] == result["tokens"] == 25
    assert not result["identical"]  # raw logprobs show the default kernels' mismatch


def test_zm_parity_compares_nothing_when_an_engine_step_failed(capsys, monkeypatch):
    # a failed step ends its requests with partial tokens; those used to be compared as "identical"
    from zeromismatch.engine.runner import ModelRunner

    execute, calls = ModelRunner.execute, []

    def fails_on_the_fourth_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("injected kernel failure")
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "execute", fails_on_the_fourth_step)
    with pytest.warns(RuntimeWarning):
        rc = main(["parity", "--model", "tiny-qwen3", "--num-prompts", "5", "--max-tokens", "5", "--json"])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    assert "engine error" in captured.err and "injected kernel failure" in captured.err


# the quantized (preset, format) pairs of the parity grid, and one dense preset, all in bf16
QUANT_AND_BF16 = [pytest.param(p, q, id=f"{p}-bf16-{q}") for p, q in QUANTIZED] + [
    pytest.param("tiny-qwen3", "none", id="tiny-qwen3-bf16-dense")
]


@pytest.mark.slow
@pytest.mark.parametrize("preset, quant", QUANT_AND_BF16)
def test_zm_parity_exact_zeros_aligned_not_default_with_quant_bf16_and_truncated_sampling(
    capsys, preset, quant
):
    options = ["--model", preset, "--quant", quant, "--dtype", "bf16", "--num-prompts", "4",
               "--max-tokens", "4", "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9",
               "--max-num-seqs", "2", "--json"]  # fmt: skip
    rc = main(["parity", *options, "--kernels", "aligned"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["identical"] is True
    assert result["tokens"] == result["informative_tokens"] == 16  # no logprob is 0 on both sides
    assert [result[k] for k in ("diff_max", "diff_mean", "diff_std", "k3_kl")] == [0.0] * 4
    echoed = [result[k] for k in ("quant", "dtype", "temperature", "top_k", "top_p", "max_num_seqs")]
    assert echoed == [quant, "bf16", 0.8, 5, 0.9, 2]

    def default_differs(seed):
        rc = main(["parity", *options, "--kernels", "default", "--seed", str(seed)])
        result = json.loads(capsys.readouterr().out)
        assert rc == 0
        # tokens the default engine sampled outside the trainer's top-k/top-p support (-inf there;
        # at seeds 0-5 of the fp8 / nvfp4 cases but one) are counted, not refused (until session 15
        # they made the run exit 2 as bad input)
        assert result["tokens"] + result["nonfinite_tokens"] == 16
        return not result["identical"]

    assert first_mismatch(default_differs) is not None


@pytest.mark.slow
def test_zm_parity_reports_tokens_outside_the_trainers_support(capsys):
    """Default kernels under top-k: the engine samples tokens the trainer's top-k excludes (-inf
    there). The run reports them (text: a nonfinite_tokens line and a note on stderr) and exits 0
    with identical False; it used to exit 2 as if the input were bad."""
    options = ["parity", "--model", "tiny-qwen3-moe", "--quant", "fp8", "--dtype", "bf16", "--kernels",
               "default", "--num-prompts", "4", "--max-tokens", "4", "--temperature", "0.8", "--top-k", "5",
               "--top-p", "0.9", "--max-num-seqs", "2"]  # fmt: skip

    def outside_support(seed):
        rc = main([*options, "--seed", str(seed)])
        captured = capsys.readouterr()
        assert rc == 0 and "identical" in captured.out
        if "nonfinite_tokens" not in captured.out:
            return False
        assert "identical  False" in captured.out and "outside the trainer's top-k/top-p" in captured.err
        return True

    assert first_mismatch(outside_support) is not None  # (seeds 0-5 all have such tokens here)


def test_parity_stats_count_excluded_tokens_and_refuse_broken_ones():
    """-inf on one side (a token outside the trainer's support) is counted; a nan or +inf logprob
    is a broken side, one clear error; informative_tokens counts among the compared tokens."""
    from zeromismatch.parity import diff_stats

    rollout = torch.tensor([-0.5, -1.0, 0.0, -2.0])
    trainer = torch.tensor([-0.5, float("-inf"), 0.0, -2.5])
    stats = diff_stats(rollout, trainer)
    assert (stats["tokens"], stats["nonfinite_tokens"], stats["informative_tokens"]) == (3, 1, 2)
    assert stats["identical"] is False and stats["diff_max"] == 0.5
    for broken in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="nan or \\+inf"):
            diff_stats(rollout, torch.tensor([-0.5, broken, 0.0, -2.0]))


def test_zm_parity_engine_vllm_refuses_what_the_plugin_cannot_serve(capsys):
    """Checked before any model is built or vLLM imported; each error names the flag."""
    cases = [
        (["--tp", "2"], "--tp 2: the vLLM plugin runs at tensor-parallel size 1"),
        (["--rollout-kernels", "default"], "--rollout-kernels default: the vLLM plugin runs the aligned"),
        (["--rollout-quant", "fp8"], "--rollout-quant fp8: the vLLM plugin serves unquantized"),
        (["--rollout-dtype", "bf16", "--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3"),
    ]
    for extra, message in cases:
        model = [] if "--model" in extra else ["--model", "tiny-qwen3"]
        rc = main(["parity", *model, "--engine", "vllm", "--max-tokens", "2", *extra])
        captured = capsys.readouterr()
        assert rc == 2 and message in captured.err, (extra, captured.err)
    # every family the project has is served, the hybrid too (its Mamba2 state in vLLM's Mamba cache)
    from zeromismatch.integrations.vllm import serving_problems
    from zeromismatch.models.presets import PRESETS

    for preset in sorted({v["model_type"]: name for name, v in PRESETS.items()}.values()):
        assert serving_problems(preset, "aligned", "none", "auto", "fp32") == [], preset
