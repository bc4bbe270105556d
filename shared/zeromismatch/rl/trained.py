"""A trained policy read back from a ``zm train`` run: its config, weights and task prompts.

Mismatch measured on random-init weights understates a trained policy's by 4-150x, so ``zm parity
--checkpoint RUN_DIR`` measures a stack on these. ``RUN_DIR`` is a run directory (its latest checkpoint;
``checkpoint_every > 0`` also saves ``step_000000``, the warm-started weights before any RL update) or one
``RUN_DIR/checkpoints/step_N`` directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..train import checkpoint as ckpt
from .config import RLConfig


@dataclass
class TrainedPolicy:
    config: RLConfig  # the run's config (its numerics are the run's, not necessarily the measurement's)
    weights: dict[str, torch.Tensor]  # HF-named master weights
    path: Path  # the checkpoint directory read
    step: int

    @property
    def weights_sha256(self) -> str:
        from .learner import state_dict_sha256

        return state_dict_sha256(self.weights)

    def build(self, numerics: dict, side: str):
        """This policy's model on ``side`` in ``numerics`` (RLConfig's numerics fields) with its weights;
        the rollout side dense (the caller quantizes it as a weight update would)."""
        from .learner import build_policy

        config = self.config.replace(**numerics)
        if side == "rollout":
            config = config.replace(quant="none", rollout_quant="none")
        model = build_policy(config, side)
        model.load_state_dict_hf(self.weights, source=f"checkpoint {self.path}")
        return model

    def prompts(self, count: int) -> list[list[int]]:
        """``count`` train-split task prompts the run's RL batches draw (from batch 0 on), tokenized as
        rollouts tokenize them."""
        from ..envs import default_tokenizer, make_env
        from .loop import env_options, task_seeds_for_batch

        tok = default_tokenizer()
        options = {k: v for k, v in env_options(self.config).items() if k != "step_latency_s"}
        env = make_env(self.config.env, **options)
        seeds: list[int] = []
        batch = 0
        while len(seeds) < count:
            seeds.extend(task_seeds_for_batch(self.config, batch))
            batch += 1
        return [tok.encode(env.reset(seed, "train"), add_bos=True) for seed in seeds[:count]]

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        from .rollout import stop_token_ids

        return stop_token_ids()


def load_trained_policy(path: str | Path) -> TrainedPolicy:
    """The policy saved at ``path`` (a run directory or a checkpoint directory). Raises ValueError
    naming the path when it holds neither or its checkpoint cannot be read."""
    path = Path(path)
    try:
        if (path / "checkpoints").is_dir():
            latest = ckpt.latest_checkpoint(path / "checkpoints")
            if latest is None:
                raise ValueError(
                    f"--checkpoint {path}: the run has no published checkpoint (checkpoint_every 0?)"
                )
            step_dir = latest
        elif (path / "state.pt").is_file():
            step_dir = path
        else:
            raise ValueError(
                f"--checkpoint {path}: neither a run directory with checkpoints/ nor a checkpoint "
                "directory holding state.pt"
            )
        loaded = ckpt.load_checkpoint(step_dir)
    except ckpt.CheckpointError as err:
        raise ValueError(f"--checkpoint: {err}") from None
    config_dict = loaded.meta.get("config") if isinstance(loaded.meta, dict) else None
    if not isinstance(config_dict, dict):
        raise ValueError(f"--checkpoint {step_dir}: meta.json holds no run config")
    state = loaded.state.get("model") if isinstance(loaded.state, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"--checkpoint {step_dir}: state.pt holds no model weights")
    return TrainedPolicy(
        RLConfig.from_dict(json.loads(json.dumps(config_dict))), state, step_dir, loaded.step
    )


def make_warm_start(config: RLConfig, out_dir: str | Path, quiet: bool = True) -> TrainedPolicy:
    """Run ``config``'s supervised warm start alone and save it as ``out_dir/checkpoints/step_000000`` (the
    layout of a run's own warm-start checkpoint); returns it read back."""
    from .warm_start import build_warm_start

    build_warm_start(config, out_dir, quiet)
    return load_trained_policy(out_dir)
