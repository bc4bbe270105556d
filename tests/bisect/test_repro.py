"""Real (unplanted) divergences: a backend with one stock op is bisected to that op, and the
written repro is standalone, fails with the default kernels and passes with the aligned ones."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys

import pytest
from bisect_helpers import baseline, config, mixed_kernels

from zeromismatch.bisect import run_bisect, write_repro
from zeromismatch.bisect.recorder import canonical_op, site_op
from zeromismatch.cli import main

# (preset, stock op, config overrides). A backend that is aligned except for one stock op
# diverges only where that op's stock kernel depends on the batch / phase for these inputs,
# so each case searches seeds 0..3 in order for a diverging run (the entries were chosen
# because one exists on this CPU; the attention case makes both entry points stock).
LARGER = dict(num_seqs=3, max_prompt_len=12, max_response_len=6)
ONE_STOCK_OP = [
    ("tiny-qwen3", "linear", {}),
    ("tiny-qwen3", "row_parallel_linear", {}),
    ("tiny-qwen3", "attention", {}),
    ("tiny-qwen3", "lm_head", {}),
    ("tiny-qwen3", "quant_linear", {"quant": "fp8"}),
    ("tiny-deepseek-v3", "moe_route", {}),
    ("tiny-deepseek-v3", "moe_experts", {}),
    ("tiny-deepseek-v3", "attention", {}),
    ("tiny-nemotron-h", "causal_conv1d", {}),
    ("tiny-nemotron-h", "moe_experts", {}),
    ("tiny-nemotron-h", "ssm_scan", LARGER),
    ("tiny-nemotron-h", "quant_linear", {"quant": "nvfp4", "dtype": "bf16"}),
]


def _diverging_run(preset: str, op: str, overrides: dict):
    kernels = mixed_kernels(_stock(op))
    for seed in range(4):
        result = run_bisect(config(preset, kernels, kernels, **{**overrides, "seed": seed}))
        if result.first is not None:
            return result
    pytest.fail(f"{preset}: a backend with stock {op} never diverged for seeds 0..3 ({overrides})")


def _stock(op: str) -> set[str]:
    return {"attention", "paged_attention"} if op == "attention" else {op}


def _repro(directory, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(directory / "repro.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(directory.parent),
    )


@pytest.mark.parametrize(
    "preset, op, overrides",
    [
        # the larger workload and NVFP4 dequantization take several seconds
        pytest.param(
            p,
            o,
            kw,
            id=f"{p}-{o}",
            marks=[pytest.mark.slow] if kw is LARGER or "nvfp4" in kw.values() else [],
        )
        for p, o, kw in ONE_STOCK_OP
    ],
)
def test_one_stock_op_is_found_as_the_first_divergence(preset, op, overrides):
    first = _diverging_run(preset, op, overrides).first
    # the stock op runs on the engine side; the fake-quantized learner runs quant_linear's work as linear
    assert canonical_op(first.engine_op) == canonical_op(op) and site_op(first.op) == site_op(op)
    assert first.inputs_identical is True and not first.perturbed


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
    return names


@pytest.mark.slow
def test_default_vs_default_repro_fails_with_default_and_passes_with_aligned(tmp_path):
    result = run_bisect(config("tiny-qwen3", "default", "default"))
    spec = write_repro(result, tmp_path / "written")
    # standalone: a copy elsewhere runs, importing only torch, safetensors, zeromismatch.kernels
    directory = tmp_path / "moved" / "repro"
    shutil.copytree(tmp_path / "written", directory)
    third_party = {n.split(".")[0] for n in _imports(directory / "repro.py")} - set(sys.stdlib_module_names)
    assert third_party == {"torch", "safetensors", "zeromismatch"}
    ours = {n for n in _imports(directory / "repro.py") if n.startswith("zeromismatch")}
    assert ours == {"zeromismatch.kernels"}
    assert spec["op"] == {"rollout": result.first.op, "trainer": result.first.op}
    assert spec["minimize"]["reproduces"] and not spec["injected"]

    recorded = _repro(directory)
    assert recorded.returncode == 1 and "FAIL" in recorded.stdout, recorded.stdout + recorded.stderr
    before = _repro(directory, "--kernels", "default")
    assert before.returncode == 1 and "DIFFERENT" in before.stdout, before.stdout + before.stderr
    after = _repro(directory, "--kernels", "aligned")
    assert after.returncode == 0 and "PASS: bitwise identical" in after.stdout, after.stdout + after.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, op, overrides",
    [
        ("tiny-qwen3", "attention", {}),
        ("tiny-nemotron-h", "ssm_scan", LARGER),
        ("tiny-nemotron-h", "quant_linear", {"quant": "nvfp4", "dtype": "bf16"}),
    ],
    ids=["paged-attention", "ssm-scan-with-state", "nvfp4-quant-linear"],
)
def test_repro_of_a_real_divergence_fails_with_default_passes_with_aligned(tmp_path, preset, op, overrides):
    result = _diverging_run(preset, op, overrides)
    spec = write_repro(result, tmp_path / "repro")
    assert canonical_op(spec["op"]["rollout"]) == op and site_op(spec["op"]["trainer"]) == site_op(op)
    assert spec["minimize"]["reproduces"]
    rollout_args = spec["args"]["rollout"]
    if op == "attention":  # the engine call carries its paged cache, kept whole
        assert spec["op"]["rollout"] == "paged_attention" and rollout_args["k_cache"]["kind"] == "tensor"
        assert not spec["minimize"]["rollout_minimized"]
    elif op == "ssm_scan":  # ... or the SSM state it continues from
        assert rollout_args["ssm_state"]["kind"] == "tensor"
        assert not spec["minimize"]["rollout_minimized"]
    else:  # the quantized weight round-trips
        qweight = rollout_args["qweight"]
        assert qweight["kind"] == "quantized_weight" and qweight["format"] == "nvfp4"
        assert "global_scale" in qweight["tensors"]
        # the default quant_linear scales activations batch-wide: one row alone computes other bits,
        # so the call is kept whole rather than shrunk into a different computation (found by review)
        assert not spec["minimize"]["rollout_minimized"]
    # the mixed backend was an unregistered object: the repro asks for a registered set
    unnamed = _repro(tmp_path / "repro")
    assert unnamed.returncode == 2 and "unknown kernel set" in unnamed.stdout, unnamed.stdout + unnamed.stderr
    before = _repro(tmp_path / "repro", "--kernels", "default")
    assert before.returncode == 1, before.stdout + before.stderr
    after = _repro(tmp_path / "repro", "--kernels", "aligned")
    assert after.returncode == 0, after.stdout + after.stderr


@pytest.mark.slow
def test_repro_of_a_planted_divergence_says_so_and_passes_everywhere(tmp_path):
    result = run_bisect(config("tiny-qwen3", perturb="silu_mul@1"), trainer=baseline("tiny-qwen3").trainer)
    spec = write_repro(result, tmp_path / "repro")
    assert spec["injected"] and not spec["minimize"]["reproduces"]
    assert "planted by `--perturb`" in (tmp_path / "repro" / "README.md").read_text()
    assert _repro(tmp_path / "repro").returncode == 0


def test_write_repro_without_divergence_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no divergence to reproduce"):
        write_repro(baseline("tiny-qwen3"), tmp_path)


SMALL_ARGS = ["--num-seqs", "2", "--max-prompt-len", "9", "--max-response-len", "3"]


def test_cli_aligned_json_exit_zero(capsys):
    rc = main(
        [
            "bisect",
            "--model",
            "tiny-qwen3-moe",
            "--rollout-kernels",
            "aligned",
            "--trainer-kernels",
            "aligned",
            "--json",
            *SMALL_ARGS,
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["diverged"] is False and out["first_divergence"] is None
    assert out["logprob_diff"]["identical"] is True and out["repro"] is None


def test_cli_default_table_exit_one_and_writes_repro(capsys, tmp_path, monkeypatch):
    import zeromismatch.io

    written = []
    atomic_write_bytes = zeromismatch.io.atomic_write_bytes

    def spy(path, data):
        written.append(path.name)
        atomic_write_bytes(path, data)

    monkeypatch.setattr(zeromismatch.io, "atomic_write_bytes", spy)
    rc = main(
        [
            "bisect",
            "--model",
            "tiny-qwen3",
            "--rollout-kernels",
            "default",
            "--trainer-kernels",
            "default",
            "--out",
            str(tmp_path / "r"),
            *SMALL_ARGS,
        ]
    )
    text = capsys.readouterr().out
    assert rc == 1
    assert "FIRST DIVERGENCE" in text and "DOWNSTREAM" in text and "repro written to" in text
    assert {p.name for p in (tmp_path / "r").iterdir()} == {
        "repro.py",
        "repro.json",
        "README.md",
        "expected.safetensors",
        "rollout_inputs.safetensors",
        "trainer_inputs.safetensors",
    }
    # the tensors are written atomically too: a killed run leaves no truncated .safetensors
    tensors = sorted(name for name in written if name.endswith(".safetensors"))
    assert tensors == [f"{n}.safetensors" for n in ("expected", "rollout_inputs", "trainer_inputs")]


def test_cli_out_that_is_a_file_exits_two_before_bisecting(capsys, tmp_path, monkeypatch):
    import zeromismatch.bisect.report

    monkeypatch.setattr(zeromismatch.bisect.report, "run_bisect", lambda *a, **k: pytest.fail("bisected"))
    afile = tmp_path / "afile"
    afile.write_text("hi")
    for out in (afile, afile / "sub"):
        rc = main(["bisect", "--model", "tiny-qwen3", "--rollout-kernels", "default", "--trainer-kernels",
                   "default", "--out", str(out), *SMALL_ARGS])  # fmt: skip
        err = capsys.readouterr().err
        assert rc == 2 and "is not a directory" in err and err.count("\n") == 1


def test_cli_perturb_json_names_the_planted_op(capsys):
    rc = main(
        [
            "bisect",
            "--model",
            "tiny-nemotron-h",
            "--rollout-kernels",
            "aligned",
            "--trainer-kernels",
            "aligned",
            "--perturb",
            "ssm_scan@2",
            "--json",
            *SMALL_ARGS,
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    first = out["first_divergence"]
    assert (first["op"], first["layer"], first["perturbed"]) == ("ssm_scan", 2, True)
    assert out["perturbation"]["path"] == first["path"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--perturb", "conv@1"], "unknown op 'conv'"),
        (["--rollout-kernels", "nope"], "unknown kernel set 'nope'"),
        (["--model", "tiny-llama"], "unknown model preset 'tiny-llama'"),
    ],
)
def test_cli_bad_input_exit_two_with_one_message(capsys, args, message):
    base = {"--model": "tiny-qwen3", "--rollout-kernels": "aligned", "--trainer-kernels": "aligned"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    rc = main(["bisect", *[x for kv in base.items() for x in kv], *SMALL_ARGS])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
