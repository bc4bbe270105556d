"""The weights-fit check: exact byte counts, one clear error, and zm parity refusing before it allocates."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.models import build_model, memory, resolve_config
from zeromismatch.parity import run_parity

GIB = 2**30


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-deepseek-v3", "tiny-nemotron-h"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_bytes_counts_every_parameter_and_buffer(preset, dtype):
    model = build_model(preset, dtype=dtype)
    # routers kept in fp32 are counted at the model dtype: the estimate is of the weights' order, and
    # for the full presets (where it matters) routers are a negligible share
    numel = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    assert memory.weight_bytes(resolve_config(preset), dtype) == numel * dtype.itemsize


def test_full_preset_count_matches_the_published_size():
    assert 4.0e9 < memory.weight_bytes(resolve_config("qwen3-4b"), torch.float32) / 4 < 4.1e9


def test_check_names_the_preset_the_need_and_what_is_available():
    config = resolve_config("qwen3-4b")
    with pytest.raises(ValueError, match=r"--model qwen3-4b: 2 copies .* float32 need 30\.0 GiB .* 8\.0 GiB"):
        memory.check_weights_fit(config, torch.float32, copies=2, what="--model qwen3-4b", available=8 * GIB)
    memory.check_weights_fit(config, torch.float32, copies=2, what="x", available=64 * GIB)  # fits: no error


def test_available_memory_is_read_on_linux():
    available = memory.available_memory_bytes()
    assert available is not None and available > 0


def test_parity_refuses_a_model_that_cannot_fit_before_building_it(monkeypatch):
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 1 * GIB)
    never_build = lambda *a, **k: pytest.fail("built the model")  # noqa: E731
    monkeypatch.setattr("zeromismatch.engine.llm.build_preset", never_build)
    with pytest.raises(ValueError, match="qwen3-4b.*GiB available"):
        run_parity("qwen3-4b")
