from __future__ import annotations

import json

from zeromismatch.rl import RLConfig


def tiny_config(**overrides) -> RLConfig:
    """The smallest run that still exercises every stage: 2 prompts x 2 samples, 4 new tokens."""
    base = dict(
        env="arithmetic", steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4,
        eval_size=2, eval_samples=1, micro_batch_size=4,
    )  # fmt: skip
    base.update(overrides)
    return RLConfig(**base)


def read_metrics(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time_")} for line in lines]
