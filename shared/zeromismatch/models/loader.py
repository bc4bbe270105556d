"""Hugging Face checkpoints: safetensors in, safetensors out, validated.

``load_pretrained(dir)`` reads ``config.json`` (``ModelConfig.from_hf_config``) and
``model.safetensors`` or a sharded ``model.safetensors.index.json``; every tensor is checked
(names, shapes, floating dtype, finiteness) before any is copied into the model, and each kind
of bad input raises one ValueError naming the file or tensor: unsupported architecture,
missing config fields, a missing/truncated/corrupt safetensors file, missing or unexpected or
wrongly shaped tensors, NaN/Inf weights.

``save_pretrained(model, dir)`` writes the HF-named full tensors (gathered across TP ranks;
only TP rank 0 writes) to ``model.safetensors`` and the HF ``config.json``, each through an
atomic temp-file + fsync + rename, weights first, so a crash never leaves a half-written
file. Saving then loading with the same dtype reproduces every tensor bit for bit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..io import atomic_write_bytes, atomic_write_text
from ..kernels.base import KernelSet
from .causal_lm import CausalLM
from .config import ModelConfig

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file; any read failure is a ValueError naming the file."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: safetensors file not found")
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    except ValueError as err:
        if str(err).startswith(str(path)):
            raise
        raise ValueError(f"{path}: not a valid safetensors file ({err})") from None
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError) for corrupt files
        raise ValueError(f"{path}: not a valid safetensors file ({type(err).__name__}: {err})") from None
    return tensors


def read_checkpoint_tensors(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a HF checkpoint directory (single file or sharded with an index)."""
    directory = Path(directory)
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file():
        return read_safetensors(single)
    if not index.is_file():
        raise ValueError(f"{directory}: no {WEIGHTS_NAME} or {INDEX_NAME}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{index}: not a valid safetensors index ({err!r})") from None
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        for name, tensor in read_safetensors(directory / shard).items():
            if name in tensors:
                raise ValueError(f"{directory / shard}: tensor {name!r} appears in more than one shard")
            tensors[name] = tensor
    return tensors


def load_pretrained(
    directory: str | os.PathLike,
    kernels: str | KernelSet = "aligned",
    dtype: torch.dtype = torch.float32,
    tp_group=None,
) -> CausalLM:
    """Build the model ``config.json`` describes and load its safetensors weights."""
    from . import build_model

    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{directory}: checkpoint directory not found")
    config = ModelConfig.from_hf_config(directory / CONFIG_NAME)
    tensors = read_checkpoint_tensors(directory)
    model = build_model(config, kernels=kernels, dtype=dtype, tp_group=tp_group, seed=None)
    model.load_state_dict_hf(tensors, source=str(directory))
    return model


def save_pretrained(model: CausalLM, directory: str | os.PathLike) -> None:
    """Write ``model.safetensors`` + ``config.json`` (HF names and layout), atomically per file."""
    from safetensors.torch import save

    if not isinstance(model, CausalLM):
        raise TypeError(f"save_pretrained takes a CausalLM, got {type(model).__name__}")
    tensors = model.state_dict_hf()  # collective under TP: every rank must call save_pretrained
    if model.tp.rank != 0:
        return
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
    config = model.config.to_hf_dict()
    config["dtype"] = str(model.dtype).removeprefix("torch.")
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
