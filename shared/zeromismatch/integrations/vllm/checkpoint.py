"""Write a project model as a Hugging Face checkpoint directory vLLM can load.

``save_pretrained`` already writes HF names and layout; the only change is ``architectures``:
the plugin's name for the family (``FAMILY_TO_ARCHITECTURE``) routes vLLM to the plugin's
wrapper, ``stock=True`` keeps the family's HF name so that vLLM runs its own implementation on
the same weights (the inverse test). The plugin's kernel set is recorded under ``KERNELS_KEY``. No
tokenizer is written: the plugin's callers pass token ids and start vLLM with
``skip_tokenizer_init=True``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...io import atomic_write_text
from ...models.loader import CONFIG_NAME, save_pretrained
from . import FAMILY_TO_ARCHITECTURE, KERNEL_SETS

#: config.json key naming the kernel set the plugin runs the checkpoint on (absent: aligned)
KERNELS_KEY = "zeromismatch_kernels"


def write_checkpoint(
    model, directory: str | os.PathLike, stock: bool = False, kernels: str = "aligned"
) -> Path:
    """Save ``model`` (a ``CausalLM``) into ``directory``; returns the directory. ``kernels``: the
    plugin's kernel set for it, ``aligned`` or ``aligned-native`` (the trainer that recomputes its
    logprobs must run the same set)."""
    family = model.config.family
    if family not in FAMILY_TO_ARCHITECTURE:
        raise ValueError(
            f"the vLLM plugin has no wrapper for the {family!r} family "
            f"(supported: {', '.join(sorted(FAMILY_TO_ARCHITECTURE))})"
        )
    if kernels not in KERNEL_SETS:
        raise ValueError(f"the vLLM plugin runs the {' or '.join(KERNEL_SETS)} kernels, not {kernels!r}")
    directory = Path(directory)
    save_pretrained(model, directory)
    config_path = directory / CONFIG_NAME
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = [model.config.architecture if stock else FAMILY_TO_ARCHITECTURE[family]]
    if not stock:
        config[KERNELS_KEY] = kernels
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory
