"""benchmarks/{ops,rollout,async}.py: bad arguments exit 2 with one message before any work."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}_args", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("ops", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("ops", ["--threads", "-2"], "--threads: must be >= 0"),
        ("rollout", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("rollout", ["--batch", "0"], "--batch: must be >= 1"),
        ("rollout", ["--new-tokens", "0"], "--new-tokens: must be >= 1"),
        ("rollout", ["--threads", "-2"], "--threads: must be >= 1"),
        ("rollout", ["--model", "nope"], "unknown --model 'nope'"),
        ("rollout_breakdown", ["--repeats", "0"], "--repeats: must be >= 1"),
        ("rollout_breakdown", ["--new-tokens", "0"], "--new-tokens: must be >= 1"),
        ("rollout_breakdown", ["--model", "nope"], "unknown --model 'nope'"),
        ("rollout", ["--temperature", "-1"], "--temperature: must be a finite number >= 0.0"),
        ("rollout_breakdown", ["--temperature", "nan"], "--temperature: must be a finite number >= 0.0"),
        ("async", ["--steps", "0"], "--steps: must be >= 1"),
        ("async", ["--lag", "-1"], "--lag: must be >= 1"),
        ("async", ["--repeats", "two"], "expected an integer"),
        ("async", ["--model", "nope"], "unknown --model 'nope'"),
    ],
)
def test_bad_arguments_exit_two_before_any_work(name, args, message, capsys, monkeypatch):
    module = _load(name)
    for heavy in ("dense_cases", "build_preset"):  # the first real work each script does
        if hasattr(module, heavy):
            monkeypatch.setattr(module, heavy, lambda *a, **k: pytest.fail("started work"))
    monkeypatch.setitem(sys.modules, "ray", None)  # async.py: importing ray would be the first work
    with pytest.raises(SystemExit) as exit_info:
        module.main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err
    assert err.count("error:") == 1


SCRIPTS = ["ops", "rollout", "rollout_breakdown", "async", "gemm_portability", "vllm_peer"]
HEAVY = ("dense_cases", "build_preset", "import_vllm", "probe_rows", "probe_tiles")


def _guard(module, monkeypatch):
    for heavy in HEAVY:  # the first real work each script does
        if hasattr(module, heavy):
            monkeypatch.setattr(module, heavy, lambda *a, **k: pytest.fail("started work"))
    monkeypatch.setitem(sys.modules, "ray", None)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bad_out_is_one_error_before_any_work(name, tmp_path, capsys, monkeypatch):
    module = _load(name)
    _guard(module, monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--out", str(afile / "x.json"), "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--out" in err and "is not a directory" in err
    assert err.count("error:") == 1


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("gemm_portability", ["--device", "gpu"], "bad --device 'gpu'"),
        pytest.param(
            "ops", ["--device", "cuda"], "torch sees no CUDA device",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is present"),
        ),
    ],
)  # fmt: skip
def test_bad_device_is_one_error(name, args, message, capsys, monkeypatch):
    module = _load(name)
    _guard(module, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        module.main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("error:") == 1


def test_ops_exits_non_zero_when_every_case_failed(monkeypatch, capsys):
    module = _load("ops")
    # a CUDA device that passes the --device check (tested on its own), on which every case fails
    monkeypatch.setattr(module, "device_or_exit", lambda parser, text: module.torch.device(text))
    monkeypatch.setattr(module, "measure", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no kernel")))
    assert module.main(["--device", "cuda", "--only", "rms_norm", "--repeats", "1", "--quiet"]) == 1
    assert "every case failed" in capsys.readouterr().err


def test_ops_only_with_an_unknown_op_is_one_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _load("ops").main(["--only", "rms_norm,bogus", "--repeats", "1", "--quiet"])
    assert exit_info.value.code == 2
    assert "unknown op(s) ['bogus']" in capsys.readouterr().err


def test_sequence_cases_bad_only_regex_is_one_error():
    import subprocess

    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ops_sequence_cases.py"), "--only", "["],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "--only '['" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmarks_write_nothing_unless_given_out(name, monkeypatch):
    """Print-only by default (zm bench runs them): only an explicit --out writes a file."""
    import argparse

    module = _load(name)
    parsed = []

    class Parsed(Exception):
        pass

    real_parse = argparse.ArgumentParser.parse_args

    def record(self, args=None, namespace=None):
        parsed.append(real_parse(self, args, namespace))
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", record)
    with pytest.raises(Parsed):
        module.main([])
    assert parsed[0].out == ""


def test_make_bench_runs_the_suite_that_holds_every_file_the_audit_reads():
    from zeromismatch.audit.benchmark_suite import BY_NAME, SUITE
    from zeromismatch.audit.benchmarks import SECTIONS
    from zeromismatch.audit.registry import load_registry

    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    recipe = makefile.split("\nbench: venv\n", 1)[1].split("\n\n", 1)[0]
    assert "benchmarks/run_all.py" in recipe
    assert all((BENCHMARKS / bench.script).is_file() for bench in SUITE)
    claims = load_registry(BENCHMARKS.parent / "results").claims
    tests = [c["test"] for c in claims if "test" in c]
    judged = {f"{t['benchmark']}.json" for t in tests if t["data"] == "benchmark"}
    shown = {name for name, _ in SECTIONS} - {"vllm_peer.json"}  # the peer runs in its own venv
    assert judged | shown <= set(BY_NAME), sorted((judged | shown) - set(BY_NAME))


@pytest.mark.native
def test_every_native_twin_names_an_existing_op_case():
    """A typo in ops_sequence_cases._NATIVE_OPS would silently drop that op's aligned-native rows."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        ops = _load("ops")
        dense = ops.dense_cases()
        cases = dense + ops.sequence_cases(dense)
    finally:
        sys.path.remove(str(BENCHMARKS))
    names = {case.name for case in cases}
    sequence = _load("ops_sequence_cases")
    for op in sequence._NATIVE_OPS:
        assert op in names and f"{op}_native" in names, op
