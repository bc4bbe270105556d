"""Will a preset's weights fit in this machine's memory? Checked before any are allocated.

A full-size preset on a laptop (``zm parity --model qwen3-4b`` builds the engine's copy and the
trainer's copy: 2 x 4.0e9 fp32 parameters = 32 GB) used to end in the kernel's OOM killer, which
prints nothing the user can act on. :func:`check_weights_fit` counts the parameters by building the
model on the meta device (no memory, ~1 s for the largest preset), multiplies by the bytes per element
and the number of copies the caller will hold, and raises one ValueError naming the preset, the need
and what is available. "Available" is Linux's ``MemAvailable``, capped by the cgroup (v2) memory limit
when one is set, as on CI runners and Slurm jobs. Activations, caches and packed GEMM weights come on
top, so passing the check does not promise the run fits; failing it means it certainly would not.
"""

from __future__ import annotations

from pathlib import Path

import torch

GIB = 2**30


def weight_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of one full copy of the model's parameters and buffers in ``dtype``."""
    from . import MODEL_CLASSES

    with torch.device("meta"):
        model = MODEL_CLASSES[config.family](config, kernels="aligned")
    itemsize = torch.empty((), dtype=dtype).element_size()
    return itemsize * sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory_bytes() -> int | None:
    """Memory a new allocation can get: ``MemAvailable``, capped by the cgroup v2 limit minus its usage.
    None where neither can be read (not Linux)."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    cgroup = Path("/sys/fs/cgroup")
    limit, used = _read_int(cgroup / "memory.max"), _read_int(cgroup / "memory.current")
    if limit is not None and used is not None:
        headroom = max(limit - used, 0)
        available = headroom if available is None else min(available, headroom)
    return available


def check_weights_fit(
    config, dtype: torch.dtype, copies: int, what: str, available: int | None = None
) -> None:
    """ValueError when ``copies`` copies of the weights alone exceed the available memory."""
    available = available_memory_bytes() if available is None else available
    if available is None:
        return
    need = copies * weight_bytes(config, dtype)
    if need > available:
        dtype_name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"{what}: {copies} copies of the {config.family} weights in {dtype_name} need "
            f"{need / GIB:.1f} GiB and this machine has {available / GIB:.1f} GiB available; "
            "use a tiny preset (tiny-*), a smaller dtype, or a machine with more memory"
        )
