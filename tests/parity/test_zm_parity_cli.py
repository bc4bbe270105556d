"""``zm parity`` through the CLI entry point: JSON output and a clear error on bad input."""

import json

import pytest

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


def test_zm_parity_prefill_chunk_none_means_no_per_request_limit(capsys):
    rc = main(["parity", "--model", "tiny-qwen3", "--num-prompts", "2", "--max-tokens", "2",
               "--prefill-chunk", "none", "--json"])
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
