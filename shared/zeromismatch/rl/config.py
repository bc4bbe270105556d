"""The typed configuration of one RL run, validated once.

Experiments build these through named functions (``experiments/<name>/configs.py``);
``zm train`` builds one from flags. ``to_dict``/``from_dict`` round-trip through JSON so a
run directory's ``config.json`` is enough to rerun or resume it.

Numerics are named per side. ``kernels`` / ``dtype`` / ``quant`` are the learner's and, unless a
``rollout_*`` field overrides them, the engine's too (``--dtype`` / ``--quant`` mean both sides). The
learner always keeps its master weights in ``dtype``; with ``quant`` it runs its forward through the
engine's quantize -> dequantize path (straight-through gradient). ``rollout_dtype``, ``rollout_quant``
(re-quantized from the learner's weights at every weight update), ``kv_cache_dtype`` and
``rollout_lm_head`` describe the engine alone. Named combinations: ``rl/stacks.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from ..kernels.sampling import SamplingParams
from ..train.losses import LOSSES
from .stacks import NUMERICS_FIELDS, numerics_problems

ALGOS = ("reinforce_zero", "reinforce", "grpo", "gspo", "ppo_clip", "tis")
EXECUTORS = ("inprocess", "ray")
#: the learner's implementation: the project's own models, or Megatron-core on the same kernels
#: (zeromismatch.integrations.megatron, the ``megatron`` extra)
TRAINERS = ("zeromismatch", "megatron")
#: the rollout engine: the project's own, or a real vLLM serving the project's models through the
#: plugin (zeromismatch.integrations.vllm; run from .venv-vllm, ``make vllm-venv``)
ROLLOUT_ENGINES = ("zeromismatch", "vllm")
UPDATE_MODES = ("keep", "wait", "abort")
#: config.json keys of earlier versions -> today's field
RENAMED_FIELDS = {"lm_head_precision": "rollout_lm_head"}
MAX_LAG = 64


@dataclass
class RLConfig:
    env: str = "arithmetic"
    model: str = "tiny-qwen3"
    algo: str = "reinforce_zero"
    kernels: str = "aligned"  # the learner's kernel set
    trainer: str = "zeromismatch"  # the learner's model code: one of TRAINERS
    rollout_engine: str = "zeromismatch"  # the engine that samples episodes: one of ROLLOUT_ENGINES
    rollout_kernels: str | None = None  # the engine's; None = same as the learner (aligned stack)
    dtype: str = "float32"  # the learner's master weights and activations; the engine's unless rollout_dtype
    quant: str = "none"  # both sides' weight format (the learner fake-quantizes its masters)
    rollout_dtype: str | None = None  # the engine's weights and activations; None = dtype
    rollout_quant: str | None = None  # the engine's weight format; None = quant
    kv_cache_dtype: str = "auto"  # the engine's KV cache: auto (activation dtype) | fp8_e4m3
    rollout_lm_head: str = "fp32"  # the engine's head: fp32 | activation (a bf16 GEMM on a bf16 rollout)
    lag: int = 0  # maximum policy lag k: batch b is generated with weights version max(0, b - k)
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    logprobs_mode: str = "processed"
    lr: float = 2e-3
    grad_clip: float = 1.0  # 0 disables clipping; the pre-clip norm is always logged
    seed: int = 0
    sft_steps: int = 0  # supervised warm start on env demonstrations before RL
    # "own": this run's SFT, in its learner's numerics; "shared": one SFT per recipe, in fp32 aligned
    # numerics, cached and loaded by every run with that recipe (rl/warm_start.py)
    warm_start: str = "own"
    sft_seed: int | None = None  # the shared warm start's seed (None: seed); arms x seeds share one
    sft_batch: int = 16
    sft_lr: float = 3e-3
    eval_every: int = 0  # 0: evaluate only before and after RL
    eval_size: int = 32
    # samples per eval prompt at the training temperature/top-k/top-p for sampled pass@1 (0: greedy only)
    eval_samples: int = 4
    checkpoint_every: int = 0  # 0: no checkpoints
    # newest checkpoints kept on disk (0: all); the warm start step_000000 is always kept besides them
    keep_checkpoints: int = 2
    executor: str = "inprocess"
    update_mode: str = "keep"
    # > 0 (needs lag >= 1): the weight update of batch b lands in flight, ``update_mode`` deciding what
    # happens to the requests it meets: batch b starts on version max(0, b - lag) and, after this many
    # engine steps of the batch, the engine gets version max(0, b - lag + 1) (rl/inflight.py); 0: weights
    # change between batches only
    inflight_update_at_token: int = 0
    micro_batch_size: int = 16
    # at lag > 0 the learner re-scores each batch with the weights that generated it (one extra
    # no-grad forward) to measure the kernel mismatch apart from weight lag; False skips that audit
    # (kernel-mismatch and gap metrics are then NaN at lag > 0) -- for throughput measurements only
    audit_rollout_version: bool = True
    enable_prefix_caching: bool = True  # on where the policy supports it (not hybrid Mamba2 models)
    prefix_cache_versioned: bool = True  # False reproduces the stale-prefix bug of S2 fix 2
    kv_block_size: int = 16  # the engine's tokens per KV-cache block: the prefix cache shares whole blocks
    step_latency_s: float = 0.0  # desktop env: injected latency per env step
    env_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"max_digits": 1} for arithmetic
    wandb: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)
    algo_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from ..envs import ENVS

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"RLConfig.{name}: {why} (got {getattr(self, name)!r})")

        if self.env not in ENVS:
            raise bad("env", f"must be one of {sorted(ENVS)}")
        if self.algo not in ALGOS:
            raise bad("algo", f"must be one of {ALGOS}")
        if self.executor not in EXECUTORS:
            raise bad("executor", f"must be one of {EXECUTORS}")
        if self.trainer not in TRAINERS:
            raise bad("trainer", f"must be one of {TRAINERS}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise bad("rollout_engine", f"must be one of {ROLLOUT_ENGINES}")
        from .warm_start import WARM_START_MODES

        if self.warm_start not in WARM_START_MODES:
            raise bad("warm_start", f"must be one of {WARM_START_MODES}")
        if self.sft_seed is not None and (self.warm_start != "shared" or not isinstance(self.sft_seed, int)
                                          or isinstance(self.sft_seed, bool)):  # fmt: skip
            raise bad("sft_seed", "is an int, and only for warm_start='shared' (an own warm start uses seed)")
        if self.warm_start == "shared" and self.sft_steps == 0:
            raise bad("warm_start", "'shared' needs sft_steps > 0 (there is no warm start to share)")
        if self.update_mode not in UPDATE_MODES:
            raise bad("update_mode", f"must be one of {UPDATE_MODES}")
        for name, why in numerics_problems({key: getattr(self, key) for key in NUMERICS_FIELDS}):
            raise bad(name, why)

        def is_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        if not is_int(self.lag) or not 0 <= self.lag <= MAX_LAG:
            raise bad("lag", f"must be an int in [0, {MAX_LAG}]")
        positive = (
            "steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_size", "micro_batch_size",
            "kv_block_size",
        )  # fmt: skip
        for name in positive:
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise bad(name, "must be a positive int")
        non_negative = (
            "sft_steps", "sft_batch", "eval_every", "checkpoint_every", "keep_checkpoints", "eval_samples",
            "inflight_update_at_token",
        )  # fmt: skip
        for name in non_negative:
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be a non-negative int")
        if self.inflight_update_at_token and self.lag == 0:
            # on-policy, the next version is trained on the batch being generated: it cannot land in it
            raise bad("inflight_update_at_token", "an in-flight update needs lag >= 1 (at lag 0 the next "
                                                  "version is trained on this very batch)")  # fmt: skip
        if self.inflight_update_at_token and self.executor == "ray":
            raise bad("inflight_update_at_token", "the Ray executor swaps weights between batches only; "
                                                  "use executor='inprocess' or leave it 0")  # fmt: skip
        # every algorithm here takes a group baseline (ppo_clip gets GRPO's group-normalised advantage):
        # with one response per prompt every advantage is 0 and nothing is learned
        if self.group_size < 2:
            raise bad("group_size", "group baselines need at least 2 responses per prompt")
        for name in ("lr", "sft_lr"):
            if not is_number(getattr(self, name)) or getattr(self, name) <= 0:
                raise bad(name, "must be a finite number > 0")
        for name in ("grad_clip", "step_latency_s"):
            if not is_number(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, "must be a finite number >= 0")
        for name in ("audit_rollout_version", "enable_prefix_caching", "prefix_cache_versioned", "wandb"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be a bool")
        self._validate_sampling()
        if self.trainer == "megatron":
            self._validate_megatron()
        if self.rollout_engine == "vllm":
            for name, why in self._vllm_rollout_problems():
                got = getattr(self, name)
                raise ValueError(f"RLConfig.{name}: {why} (got {got!r} with rollout_engine='vllm')")
        accepted = set(inspect.signature(LOSSES[self.algo]).parameters) - {"batch"}
        unknown = sorted(set(self.algo_options) - accepted)
        if unknown:
            raise bad("algo_options", f"{self.algo} takes only {sorted(accepted)}, not {unknown}")

    def _validate_sampling(self) -> None:
        """The rollout's sampling settings, checked now (not after the warm start) by the engine's
        own rules; RL needs temperature > 0 (greedy groups have identical responses, and no
        gradient: every sampled token has logprob 0)."""
        try:
            params = SamplingParams(
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                max_tokens=self.max_new_tokens,
                logprobs_mode=self.logprobs_mode,
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"RLConfig: {err}") from None
        if params.greedy:
            raise ValueError(
                f"RLConfig.temperature: RL samples at temperature > 0 (got {self.temperature!r})"
            )

    def _vllm_rollout_problems(self) -> list[tuple[str, str]]:
        """What the vLLM rollout engine (integrations/vllm/engine.py) cannot serve, refused now (this
        imports no vLLM); each named by the field this config set it with."""
        from ..integrations.vllm import serving_problems

        problems = serving_problems(
            self.model, self.engine_kernels, self.engine_quant, self.kv_cache_dtype, self.rollout_lm_head
        )
        both_sides = {"rollout_kernels": "kernels", "rollout_quant": "quant"}  # (when not set apart)
        problems = [
            (both_sides[f] if f in both_sides and getattr(self, f) is None else f, why) for f, why in problems
        ]
        return problems

    def _validate_megatron(self) -> None:
        """What the Megatron learner cannot run, refused now (its module imports no megatron-core)."""
        from ..integrations.megatron.config import rl_config_problems

        for name, why in rl_config_problems(self):
            raise ValueError(f"RLConfig.{name}: {why} (got {getattr(self, name)!r} with trainer='megatron')")

    @property
    def engine_kernels(self) -> str:
        return self.rollout_kernels or self.kernels

    @property
    def engine_dtype(self) -> str:
        return self.rollout_dtype or self.dtype

    @property
    def engine_quant(self) -> str:
        return self.rollout_quant or self.quant

    @property
    def aligned_numerics(self) -> bool:
        """Both sides compute in the same numerics (kernel set, dtype, format, KV, head): the stack
        promises exact zeros."""
        return (
            self.engine_kernels == self.kernels and self.engine_dtype == self.dtype
            and self.engine_quant == self.quant and self.kv_cache_dtype == "auto"
            and self.rollout_lm_head == "fp32"
        )  # fmt: skip

    def weight_version_for_batch(self, batch_index: int) -> int:
        """The lag schedule: which learner version generates batch ``batch_index``."""
        return max(0, batch_index - self.lag)

    def evaluates_after_step(self, step: int) -> bool:
        """The mid-run eval schedule: after every ``eval_every``-th update, except the last (the
        final evaluation follows it anyway)."""
        return bool(self.eval_every) and (step + 1) % self.eval_every == 0 and step + 1 < self.steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLConfig:
        data = {RENAMED_FIELDS.get(key, key): value for key, value in data.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"RLConfig: unknown field(s) {unknown}")
        return cls(**data)

    def replace(self, **changes: Any) -> RLConfig:
        return dataclasses.replace(self, **changes)
