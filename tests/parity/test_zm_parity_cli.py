"""``zm parity`` through the CLI entry point: JSON output and a clear error on bad input."""

import json

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
