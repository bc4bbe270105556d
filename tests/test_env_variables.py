"""ZEROMISMATCH_* environment variables are validated when used, not at import.

A bad ``ZEROMISMATCH_GEMM_TILE_ROWS`` or ``ZEROMISMATCH_PACKED_WEIGHTS_MB`` leaves ``zm --help`` (and
any import) working; the first GEMM (or packed-weight lookup) that reads it raises one ValueError
naming the variable and its allowed values, and the commands that run GEMMs print that as one line
and exit 2. Both are read once per process, at import, so every case runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

TILE_ROWS = "ZEROMISMATCH_GEMM_TILE_ROWS"
BUDGET = "ZEROMISMATCH_PACKED_WEIGHTS_MB"


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=full_env)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-c", textwrap.dedent(code)], **env)


def test_help_works_whatever_the_gemm_variables_hold():
    result = _run([sys.executable, "-m", "zeromismatch.cli", "--help"], **{TILE_ROWS: "abc", BUDGET: "inf"})
    assert result.returncode == 0, result.stderr
    assert "parity" in result.stdout and "Traceback" not in result.stderr


@pytest.mark.parametrize("bad", ["abc", "1"])
def test_bad_tile_rows_are_raised_by_the_first_gemm_that_needs_them(bad):
    result = _python(
        """
        import torch
        from zeromismatch.kernels.aligned import gemm

        x, w = torch.ones(3, 4), torch.ones(5, 4)
        for call in (gemm.gemm_tile_rows, lambda: gemm.row_invariant_linear(x, w),
                     lambda: gemm.row_invariant_linear(x.double(), w.double())):
            try:
                call()
            except ValueError as err:
                print(err)
            else:
                print("no error")
        gemm.set_gemm_tile_rows(0)  # a value set in the process replaces the bad one
        print(gemm.gemm_tile_rows(), tuple(gemm.row_invariant_linear(x, w).shape))
        """,
        **{TILE_ROWS: bad},
    )
    assert result.returncode == 0, result.stderr
    *errors, after_reset = result.stdout.splitlines()
    assert len(errors) == 3 and len(set(errors)) == 1, errors
    assert errors[0].startswith(f"{TILE_ROWS} must be 0 (off) or a row count >= 2, got ") and bad in errors[0]
    assert after_reset == "0 (3, 5)"


@pytest.mark.parametrize("bad", ["inf", "-1"])
def test_a_bad_packed_weight_budget_is_raised_by_the_first_lookup(bad):
    result = _python(
        """
        import torch
        from zeromismatch.kernels.aligned import gemm

        try:
            gemm.row_invariant_linear(torch.ones(3, 4), torch.ones(5, 4))  # packs (caches) the weight
        except ValueError as err:
            print(err)
        else:
            print("no error")
        """,
        **{BUDGET: bad},
    )
    assert result.returncode == 0, result.stderr
    expected = f"{BUDGET} must be a number of MiB >= 0 (0 disables the cache), got {bad!r}"
    assert result.stdout.strip() == expected


def test_good_values_still_take_effect():
    result = _python(
        """
        from zeromismatch.kernels.aligned import gemm

        gemm.check_gemm_environment()
        print(gemm.gemm_tile_rows(), gemm.packed_weights().budget_bytes)
        """,
        **{TILE_ROWS: " 16 ", BUDGET: "0.5"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["16", str(2**19)]


ZM = [sys.executable, "-m", "zeromismatch.cli"]
COMMANDS = {
    "parity": ["parity", "--model", "tiny-qwen3", "--num-prompts", "2", "--max-tokens", "2"],
    "train": ["train", "--steps", "1", "--prompts-per-step", "1", "--group-size", "2", "--quiet"],
    "invariance": ["invariance", "--only", "linear", "--quiet"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "kernels", "variable", "bad"),
    [
        ("parity", "aligned", TILE_ROWS, "abc"),
        # the default set's GEMMs never read the tile rows (the provenance does, after the work), and
        # its engine steps would report a bad budget per request: both are checked before any work
        ("parity", "default", TILE_ROWS, "abc"),
        ("parity", "default", BUDGET, "inf"),
        ("train", "aligned", TILE_ROWS, "abc"),
        ("invariance", "default", TILE_ROWS, "abc"),
    ],
)
def test_commands_print_a_bad_variable_as_one_line_and_exit_2(tmp_path, command, kernels, variable, bad):
    args = [*ZM, *COMMANDS[command], "--kernels", kernels]
    if command == "train":
        args += ["--out", str(tmp_path / "run")]
    result = _run(args, **{variable: bad})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"zm {command}: {variable} must be")
    assert not (tmp_path / "run").exists()
