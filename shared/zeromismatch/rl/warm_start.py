"""Warm starts: the supervised checkpoint a run starts RL from, its own or one shared by many runs.

``warm_start="own"`` (the default): the run does its SFT itself, in its learner's numerics, seeded by
``seed``. Two arms with different numerics then start RL from different weights, and a difference
between them is partly a difference between warm starts.

``warm_start="shared"``: the SFT is a *recipe* (:data:`RECIPE_FIELDS` of the config, seeded by
``sft_seed``, else ``seed``) run once in the reference numerics (:data:`REFERENCE_NUMERICS`: fp32, dense
weights, the aligned kernels) and saved under the recipe's key in a cache (:func:`cache_root`); every run
with the same recipe -- every arm and every seed of an experiment, whatever its stack -- loads those
bits, and records their hash as ``warm_start_sha256``. A stack's weight format is applied to the loaded
fp32 masters (the learner fake-quantizes them, the engine quantizes them), as a deployed checkpoint is.

A shared warm start is a plain fp32 checkpoint trained in the reference numerics by the project's own
trainer (:data:`REFERENCE_TRAINER`), whatever ``trainer`` the run that asks for it names; so the recipe
(and its key) need not name the trainer, and keys recorded before ``trainer`` existed still hold. A run
with ``trainer="megatron"`` loads those HF-named bits into its Megatron model through the weight map
(``integrations/megatron/weights.py``: exact copies), so it starts RL from the same weights, and records
the same ``warm_start_sha256``, as a run on the project's trainer.

The cache holds ``<key>/checkpoints/step_000000`` (a checkpoint with per-file sha256 digests, verified
on every load) and ``<key>/warm_start.json`` (the recipe, the weights hash, the SFT losses, the commit
that built it). It is built under a lock, into a temp directory renamed into place, so concurrent arms
build it once and a killed build leaves nothing half-written. Deleting the cache only costs a rebuild,
which gives the same bits (the build is deterministic at a fixed thread count).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..io import DirectoryLockedError, atomic_write_json, directory_lock
from ..train import checkpoint as ckpt

WARM_START_MODES = ("own", "shared")
#: what decides the supervised warm start's bits (besides its seed and the reference numerics)
RECIPE_FIELDS = (
    "model", "model_overrides", "env", "env_options", "sft_steps", "sft_batch", "sft_lr",
    "micro_batch_size", "grad_clip",
)  # fmt: skip
#: the numerics a shared warm start is trained in: those of a plain fp32 checkpoint
REFERENCE_NUMERICS = {
    "kernels": "aligned", "rollout_kernels": None, "dtype": "float32", "quant": "none",
    "rollout_dtype": None, "rollout_quant": None, "kv_cache_dtype": "auto", "rollout_lm_head": "fp32",
}  # fmt: skip
#: the learner a shared warm start is trained by (see the module docstring)
REFERENCE_TRAINER = "zeromismatch"
CACHE_ENV = "ZEROMISMATCH_WARM_START_DIR"
RECORD = "warm_start.json"
LOCK_POLL_S = 1.0
STEP_DIR = "step_000000"  # train.checkpoint names step 0 so


@dataclass
class WarmStart:
    weights: dict[str, torch.Tensor]  # HF-named fp32 master weights
    sha256: str  # state_dict_sha256 of ``weights``
    sft_losses: list[float]
    key: str  # the recipe's key (its directory name in the cache)
    path: Path


def recipe(config) -> dict:
    """The shared warm start's recipe for ``config``: everything its bits depend on."""
    fields = {name: getattr(config, name) for name in RECIPE_FIELDS}
    seed = config.sft_seed if config.sft_seed is not None else config.seed
    return {**fields, "seed": seed, "numerics": dict(REFERENCE_NUMERICS)}


def recipe_key(spec: dict) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    """``$ZEROMISMATCH_WARM_START_DIR``, else ``runs/warm_starts`` of the checkout in use, else
    ``~/.cache/zeromismatch/warm_starts`` outside any checkout."""
    from ..checkout import NoCheckoutError, checkout_root

    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    try:
        return checkout_root() / "runs" / "warm_starts"
    except NoCheckoutError:
        return Path.home() / ".cache" / "zeromismatch" / "warm_starts"


def sft_config(config):
    """``config`` as its shared warm start trains: the reference numerics, the reference trainer and
    the recipe's seed."""
    spec = recipe(config)
    return config.replace(
        **REFERENCE_NUMERICS, trainer=REFERENCE_TRAINER, seed=spec["seed"], warm_start="own", sft_seed=None
    )


def build_warm_start(config, out_dir: str | Path, quiet: bool = True) -> list[float]:
    """Run ``config``'s supervised warm start (in ``config``'s own numerics) and save its weights as
    ``out_dir/checkpoints/step_000000``; returns the SFT losses."""
    from .learner import Learner, state_snapshot
    from .loop import run_sft

    torch.manual_seed(config.seed)
    learner = Learner(config)
    progress = None if quiet else (lambda line: print(line, end="\r", flush=True))
    losses = run_sft(config, learner, progress)
    if not quiet:
        print()
    meta = {"config": config.to_dict(), "sft_losses": losses}
    ckpt.save_checkpoint(Path(out_dir) / "checkpoints", 0, {"model": state_snapshot(learner.model)}, meta)
    return losses


def _load(directory: Path, key: str) -> WarmStart:
    from .learner import state_dict_sha256

    record = json.loads((directory / RECORD).read_text())
    try:
        loaded = ckpt.load_checkpoint(directory / "checkpoints" / STEP_DIR)
    except ckpt.CheckpointError as err:
        raise ckpt.CheckpointError(f"shared warm start {directory}: {err}; delete it to rebuild") from None
    weights = loaded.state["model"]
    digest = state_dict_sha256(weights)
    if digest != record["weights_sha256"]:
        raise ckpt.CheckpointError(
            f"shared warm start {directory}: its weights hash {digest[:12]} is not the recorded "
            f"{record['weights_sha256'][:12]}; delete it to rebuild"
        )
    return WarmStart(weights, digest, record["sft_losses"], key, directory)


def shared_warm_start(config, quiet: bool = True, root: Path | None = None) -> WarmStart:
    """The shared warm start of ``config``'s recipe, built once (under a lock) and then read back."""
    from .._provenance import git_commit
    from .learner import state_dict_sha256

    spec = recipe(config)
    key = recipe_key(spec)
    root = Path(root) if root is not None else cache_root()
    directory = root / key
    if (directory / RECORD).is_file():
        return _load(directory, key)
    while True:
        try:
            with directory_lock(root / f".{key}.building", "warm-start build"):
                if not (directory / RECORD).is_file():  # another process may have built it meanwhile
                    partial = root / f".{key}.partial"
                    shutil.rmtree(partial, ignore_errors=True)
                    if not quiet:
                        print(f"building the shared warm start {key} ({config.sft_steps} SFT steps)")
                    losses = build_warm_start(sft_config(config), partial, quiet)
                    state = ckpt.load_checkpoint(partial / "checkpoints" / STEP_DIR).state
                    atomic_write_json(partial / RECORD, {
                        "recipe": spec, "key": key, "weights_sha256": state_dict_sha256(state["model"]),
                        "sft_losses": losses, "git_commit": git_commit(),
                        "torch_threads": torch.get_num_threads(),
                    })  # fmt: skip
                    os.replace(partial, directory)
            break
        except DirectoryLockedError:
            time.sleep(LOCK_POLL_S)  # another arm is building the same warm start: wait for it
    shutil.rmtree(root / f".{key}.building", ignore_errors=True)
    return _load(directory, key)


def provenance_entry(config, quiet: bool = True) -> dict:
    """What a run's provenance records of its shared warm start, which this builds (or reads and
    verifies) now, before the run writes anything."""
    start = shared_warm_start(config, quiet)
    return {"mode": "shared", "key": start.key, "weights_sha256": start.sha256}


def apply_warm_start(config, learner, quiet: bool = True, root: Path | None = None) -> dict:
    """Bring ``learner`` to ``config``'s warm start; returns what the run records about it:
    ``sft_losses``, and for a shared one ``warm_start``, ``warm_start_key`` and ``warm_start_sha256``."""
    from .learner import weights_hash
    from .loop import run_sft

    if config.warm_start == "shared":
        start = shared_warm_start(config, quiet, root)
        learner.model.load_state_dict_hf(start.weights, source=f"shared warm start {start.path}")
        return {"sft_losses": start.sft_losses, "warm_start": "shared", "warm_start_key": start.key,
                "warm_start_sha256": weights_hash(learner.model)}  # fmt: skip
    # an own warm start records nothing more than it always has: summaries of earlier runs stay comparable
    return {"sft_losses": run_sft(config, learner)}
