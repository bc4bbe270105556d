"""Experiment READMEs are generated: each equals what scripts/experiment_readmes.py renders from its
configs.py now, the "differs from the base" column is computed from the configs, and --check/--write
behave as documented."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from zeromismatch.experiment import Arm, FullScale
from zeromismatch.rl import RLConfig

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/configs.py"))


def _generator():
    spec = importlib.util.spec_from_file_location(
        "experiment_readmes", ROOT / "scripts" / "experiment_readmes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


readmes = _generator()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_readme_is_what_the_generator_renders_from_configs(name):
    path = ROOT / "experiments" / name / "README.md"
    expected = readmes.render_readme(name)
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    assert current == expected, (
        f"experiments/{name}/README.md is out of date with its configs.py: run `{readmes.COMMAND}`"
    )


def test_two_arms_that_disagree_each_show_their_own_value():
    arms = [
        Arm("a", RLConfig(kernels="aligned", lag=0, steps=5), "first"),
        Arm("b", RLConfig(kernels="default", lag=8, steps=5), "second"),
    ]
    base = readmes.common_base(arms)
    assert "kernels" not in base and "lag" not in base
    assert base["steps"] == 5 and base["model"] == "tiny-qwen3"
    assert readmes.usual_values(arms) == {}  # 1 of 2 is no majority
    assert readmes.arm_differences(arms) == {
        "a": {"kernels": "aligned", "lag": 0},
        "b": {"kernels": "default", "lag": 8},
    }
    table = readmes.arms_table(arms)
    assert table[2] == "| `a` | 0 | first | `kernels=aligned`, `lag=0` |"
    assert table[3] == "| `b` | 0 | second | `kernels=default`, `lag=8` |"
    line = readmes.base_line(arms)
    assert "`steps=5`" in line and "kernels" not in line and "lag" not in line


def test_a_majority_value_moves_out_of_the_rows():
    arithmetic = {"max_digits": 2}
    arms = [
        Arm("sync", RLConfig(lag=0, env_options=arithmetic)),
        Arm("async", RLConfig(lag=8, env_options=arithmetic)),
        Arm("tools", RLConfig(env="tools", lag=8, env_options={}, dtype="bfloat16")),
    ]
    assert readmes.usual_values(arms) == {
        "env": "arithmetic",
        "env_options": arithmetic,
        "lag": 8,
        "dtype": "float32",
    }
    assert readmes.arm_differences(arms) == {
        "sync": {"lag": 0},
        "async": {},
        "tools": {"env": "tools", "env_options": {}, "dtype": "bfloat16"},
    }
    line = readmes.base_line(arms)
    # dtype's majority value is the RLConfig default (float32), so the base lines leave it out
    assert "`lag=8`" in line and "dtype" not in line
    assert readmes.arms_table(arms)[3] == "| `async` | 0 | — | — |"


def test_cells_escape_table_pipes_and_common_base_needs_arms():
    arms = [Arm("x", RLConfig(env_options={"ops": "+|-"})), Arm("y", RLConfig())]
    assert "\\|" in readmes.arms_table(arms)[2]
    with pytest.raises(ValueError, match="no arms"):
        readmes.common_base([])


def test_published_setup_says_what_the_source_does_not_state():
    full = FullScale(
        model="m", rollout_engine="vllm", trainer="megatron", gpus=None, nodes=3, updates=None, env="osworld",
        source="S9", extra={"run": {"gpus": 8, "hours": 1.5}},
    )  # fmt: skip
    lines = readmes.published_setup(full)
    assert (
        lines[1]
        == "- GPUs: not stated in the source; nodes: 3; updates: not stated; env: `osworld` (OSWorld (S3))"
    )
    assert lines[3] == "- chosen by us for the dry-run scripts (not published): nothing"
    assert lines[4] == (
        "- run sizes stated: none; not stated (to set before a real run): lr, group_size, prompts_per_step, "
        "max_new_tokens"
    )
    assert lines[5] == "- other published figures: run (gpus 8, hours 1.5)"


def test_check_writes_nothing_and_the_default_writes_then_passes(tmp_path, capsys):
    folder = tmp_path / "experiments" / "qwen3_30b_a3b_tools"
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "experiments" / "qwen3_30b_a3b_tools" / "configs.py", folder / "configs.py")
    readme = folder / "README.md"
    readme.write_text("typed by hand\n")
    assert readmes.main(["--check", "--quiet", "--root", str(tmp_path)]) == 1
    assert readme.read_text() == "typed by hand\n"
    assert readmes.COMMAND in capsys.readouterr().err
    assert readmes.main(["--quiet", "--root", str(tmp_path)]) == 0
    assert readme.read_text() == readmes.render_readme("qwen3_30b_a3b_tools", tmp_path)
    assert readmes.main(["--check", "--quiet", "--root", str(tmp_path)]) == 0


def test_a_seeded_arm_lists_its_seeds():
    from zeromismatch.experiment import Arm
    from zeromismatch.rl import RLConfig

    arms = [Arm("plain", RLConfig(seed=4), "one run"), Arm("fast", RLConfig(), "seeded", seeds=(0, 1, 2))]
    table = readmes.arms_table(arms)
    assert table[0] == "| arm | seeds | note | differs from the base |"
    assert table[2].startswith("| `plain` | 4 | one run |")
    assert table[3].startswith("| `fast` | 0, 1, 2 | seeded |")
