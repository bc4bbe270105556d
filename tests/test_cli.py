"""The installed ``zm`` entry point and the package import, exercised for real."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import zeromismatch
from zeromismatch.cli import build_parser, main


def _zm(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("zm")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "zeromismatch.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_version_prints_package_version_and_git_commit():
    out = _zm("--version")
    assert out.returncode == 0, out.stderr
    assert zeromismatch.__version__ in out.stdout
    assert re.search(r"git ([0-9a-f]{40}(-dirty)?|unknown)", out.stdout), out.stdout


def test_help_lists_subcommands():
    out = _zm("--help")
    assert out.returncode == 0, out.stderr
    assert "info" in out.stdout
    for name in build_parser()._subparsers._group_actions[0].choices:
        assert name in out.stdout


def test_info_json_reports_versions_and_kernel_sets(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["packages"]["torch"].startswith("2.13.0")
    assert {"aligned", "default"} <= set(info["kernel_sets"])
    assert info["hardware"]["cpu_count"] >= 1


def test_info_ops_names_the_function_behind_every_op(capsys):
    from zeromismatch.kernels import KernelSet
    from zeromismatch.kernels.aligned import attention

    assert main(["info", "--ops", "--kernels", "aligned", "default", "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert sorted(tables) == ["aligned", "default"]
    assert all(sorted(t) == sorted(KernelSet.__abstractmethods__) for t in tables.values())
    assert tables["aligned"]["attention"] == f"{attention.__name__}.attention"
    assert tables["default"]["attention"] != tables["aligned"]["attention"]  # a table per set, not one


def test_info_ops_bad_input_is_one_line_and_exit_2(capsys):
    assert main(["info", "--ops", "--kernels", "no-such-set"]) == 2
    assert main(["info", "--kernels", "aligned"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no-such-set" in err[0] and "--ops" in err[1]


def test_unknown_command_fails_with_usage():
    out = _zm("no-such-command")
    assert out.returncode != 0
    assert "invalid choice" in out.stderr


def test_unknown_kernel_set_is_one_clear_error():
    from zeromismatch.kernels import get_kernels

    with pytest.raises(ValueError, match="unknown kernel set 'fast-and-wrong'"):
        get_kernels("fast-and-wrong")


def test_every_kernel_set_implements_every_op_from_its_own_modules():
    from zeromismatch.kernels import KernelSet, available_kernels, get_kernels

    # aligned-native is the aligned set with its own attention, scan, conv, GEMMs, norms, rope, SwiGLU
    # product, MoE experts and MoE routing
    # (kernels/native): exactly those ops come from its package, every other op from the aligned one
    from zeromismatch.kernels.native import NativeKernels  # importing it compiles nothing

    native_ops = {"attention", "paged_attention", "ssm_scan", "linear", "lm_head", "row_parallel_linear"}
    native_ops |= {"quant_linear", "rms_norm", "gated_rms_norm", "rope", "moe_experts", "causal_conv1d"}
    native_ops |= {"silu_mul", "moe_route"}
    for name in available_kernels():
        kernels = NativeKernels if name == "aligned-native" else get_kernels(name)
        for op in KernelSet.__abstractmethods__:
            module = getattr(kernels, op).__module__
            if name == "aligned-native":
                owner = "native" if op in native_ops else "aligned"
                assert module.startswith(f"zeromismatch.kernels.{owner}."), (name, op, module)
            elif name == "fast-native" and op != "processed_log_softmax":
                # its own per-call choices (kernels/fast_native.py), or the default set's stock op
                own = module == "zeromismatch.kernels.fast_native"
                assert own or module.startswith("zeromismatch.kernels.default."), (name, op, module)
            # default may reuse the one shared sampler definition; nothing else crosses over
            elif op != "processed_log_softmax":
                assert module.startswith(f"zeromismatch.kernels.{name}."), (name, op, module)


def test_train_errors_go_to_stderr(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("hi")
    assert main(["train", "--steps", "1", "--quiet", "--out", str(afile)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("zm train: ")


def test_train_with_the_vllm_rollout_engine_and_no_vllm_is_one_line(capsys, tmp_path, monkeypatch):
    """Without vLLM in the interpreter (this suite's venv), ``--rollout-engine vllm`` says where vLLM
    is, exit 2, and leaves --out unwritten."""
    import builtins

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):  # (the same answer in a venv that has vLLM)
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    out = tmp_path / "run"
    assert main(["train", "--steps", "1", "--quiet", "--rollout-engine", "vllm", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zm train: vLLM cannot be imported here") and err.count("\n") == 1
    assert ".venv-vllm" in err
    assert not out.exists() or not any(out.iterdir())
