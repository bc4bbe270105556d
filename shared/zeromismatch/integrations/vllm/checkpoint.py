"""Write a project model as a Hugging Face checkpoint directory vLLM can load.

``save_pretrained`` already writes HF names and layout; the only change is ``architectures``:
the plugin's name for the family (``FAMILY_TO_ARCHITECTURE``) routes vLLM to the plugin's
wrapper, ``stock=True`` keeps the family's HF name so that vLLM runs its own implementation on
the same weights (the inverse test). No tokenizer is written: the plugin's callers pass token
ids and start vLLM with ``skip_tokenizer_init=True``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...io import atomic_write_text
from ...models.loader import CONFIG_NAME, save_pretrained
from . import FAMILY_TO_ARCHITECTURE


def write_checkpoint(model, directory: str | os.PathLike, stock: bool = False) -> Path:
    """Save ``model`` (a ``CausalLM``) into ``directory``; returns the directory."""
    family = model.config.family
    if family not in FAMILY_TO_ARCHITECTURE:
        raise ValueError(
            f"the vLLM plugin has no wrapper for the {family!r} family "
            f"(supported: {', '.join(sorted(FAMILY_TO_ARCHITECTURE))})"
        )
    directory = Path(directory)
    save_pretrained(model, directory)
    config_path = directory / CONFIG_NAME
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = [model.config.architecture if stock else FAMILY_TO_ARCHITECTURE[family]]
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory
