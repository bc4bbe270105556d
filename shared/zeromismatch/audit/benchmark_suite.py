"""The benchmark files the report and the verdicts read, and the command that writes each.

One list for ``make bench`` (``benchmarks/run_all.py``), ``scripts/reproduce_mini.py`` and the
report's "not run" lines, so a file the report reads is always one that the reproduction writes.
The optional stock-vLLM peer (``vllm_peer.json``) is not here: it runs in its own venv
(``make vllm-peer``).
"""

from __future__ import annotations

from dataclasses import dataclass

OUT_DIR = "results/reproduced/benchmarks"
#: the tiny presets besides tiny-qwen3 (whose rollout file is ``rollout.json``)
PRESET_ROLLOUTS = ("tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-nemotron-h")
#: S3's "within 10%" claim: the DeepSeek stand-in with the published formats' FP8 weights on both sides
FP8_ROLLOUT = "rollout_tiny-deepseek-v3_bf16_fp8-block.json"


@dataclass(frozen=True)
class BenchmarkFile:
    name: str  #: file name under results/reproduced/benchmarks/
    script: str  #: benchmarks/<script>
    args: tuple[str, ...] = ()

    def argv(self, out_dir: str = OUT_DIR, root: str = "") -> list[str]:
        """The script and its arguments; the script's path relative to the checkout ``root``."""
        script = f"{root}/benchmarks/{self.script}" if root else f"benchmarks/{self.script}"
        return [script, *self.args, "--out", f"{out_dir}/{self.name}"]

    def command(self, out_dir: str = OUT_DIR) -> str:
        return " ".join(["python", *self.argv(out_dir)])


def breakdown_file(preset: str) -> str:
    """The file ``benchmarks/rollout_breakdown.py`` writes for ``preset``."""
    return "rollout_breakdown.json" if preset == "tiny-qwen3" else f"rollout_breakdown_{preset}.json"


SUITE: tuple[BenchmarkFile, ...] = (
    BenchmarkFile("rollout.json", "rollout.py"),
    *(BenchmarkFile(f"rollout_{p}.json", "rollout.py", ("--model", p)) for p in PRESET_ROLLOUTS),
    BenchmarkFile(
        FP8_ROLLOUT,
        "rollout.py",
        ("--model", "tiny-deepseek-v3", "--dtype", "bf16", "--quant", "fp8-block", "--no-hf"),
    ),
    *(
        BenchmarkFile(breakdown_file(p), "rollout_breakdown.py", ("--model", p))
        for p in ("tiny-qwen3", *PRESET_ROLLOUTS)
    ),
    BenchmarkFile("trainer_step.json", "trainer_step.py"),
    BenchmarkFile("rl_step.json", "rl_step.py"),
    BenchmarkFile("alignment_cost.json", "alignment_cost.py"),
    BenchmarkFile("async.json", "async.py"),
    BenchmarkFile("ops.json", "ops.py", ("--threads", "1")),
)
BY_NAME = {b.name: b for b in SUITE}


#: the stock-vLLM peer's file, written outside the suite (its own venv)
VLLM_PEER = "vllm_peer.json"


def command(name: str) -> str:
    """The command that writes ``name`` (a KeyError for a file no command writes)."""
    return "make vllm-peer" if name == VLLM_PEER else BY_NAME[name].command()
