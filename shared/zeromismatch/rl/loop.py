"""RL training loops: synchronous on-policy and asynchronous with policy lag up to 64.

The lag schedule is explicit and deterministic: learner step s trains on batch s,
which the rollout worker generated with learner weights version v(s) = max(0, s − k)
(k = ``config.lag``; k = 0 is synchronous on-policy). So the policy lag of batch s is
min(s, k). The in-process executor runs the schedule sequentially; the Ray executor
(``actors.py``) runs rollout and learner concurrently — batch s+1 is generated while
the learner trains on batch s — and produces the same bits, because every batch is a
function of (weights v(b), batch index, seed) only.

With ``inflight_update_at_token`` (in-process executor only) the next version lands in the middle of
batch s instead of before batch s+1, with requests in flight (``inflight.py``: which versions, and how
the learner scores a batch of two). ``weight_version`` / ``policy_lag`` of a record are then the
batch's starting version and lag; ``lag_*`` are per token; ``inflight_version`` is the version that
landed and ``inflight_update_at_step`` the engine step it landed after (null: the batch was done first).

Per step the learner logs the mismatch metrics of ``docs/metrics.md``: kernel mismatch
(trainer at the rollout version vs the engine's recorded logprobs: exactly 0 with an
aligned stack), IS-weight peak/median, the weight-lag vs kernel decomposition, lag
statistics, loss statistics, pre-clip gradient norm and reward.

Launch: ``zm train --env arithmetic --model tiny-qwen3 --algo reinforce_zero --lag 8 --steps 50 --out runs/x``
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from .. import _provenance
from ..envs import ENVS, make_env
from ..io import atomic_write_json, atomic_write_text, directory_lock
from ..manifest import write_manifest
from ..metrics import mismatch
from ..nanmath import max_nan_wins
from ..train import checkpoint as ckpt
from .config import RLConfig
from .inflight import MixedVersionLearner, batch_versions, rollout_snapshots, token_versions
from .learner import Learner, build_policy, state_snapshot, weights_hash
from .resume_state import CRASH_AFTER_STEP_ENV, add_counts, learner_state, load_resumable, restore_learner
from .rollout import InflightUpdate, collect_episodes, demonstration_tokens
from .warm_start import apply_warm_start, provenance_entry

#: config fields a resume may change: they decide what is kept on disk, not what is computed
_RESUMABLE_CHANGES = ("keep_checkpoints",)
TIMING_PREFIX = "time_"  # metrics that legitimately differ between identical runs


class RolloutWorker:
    """Owns the rollout engine and the weight version it serves."""

    def __init__(self, config: RLConfig):
        self.config = config
        model = build_policy(config, "rollout")
        max_num_seqs = max(8, config.prompts_per_step * config.group_size)
        if config.rollout_engine == "vllm":
            from ..integrations.vllm.engine import VllmEngine

            self.engine = VllmEngine(
                model, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                enable_prefix_caching=config.enable_prefix_caching,
                prefix_cache_versioned=config.prefix_cache_versioned, block_size=config.kv_block_size,
                logprobs_mode=config.logprobs_mode, seed=config.seed, kernels=config.engine_kernels,
            )  # fmt: skip
        else:
            from ..engine import LLM

            self.engine = LLM(
                model,
                kernels=config.engine_kernels,
                kv_cache_dtype=config.kv_cache_dtype,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=2048,
                # True: on where the policy supports it (a hybrid's Mamba2 state does not), without the
                # engine's warning for an explicit request: every config carries the field's default
                enable_prefix_caching=None if config.enable_prefix_caching else False,
                prefix_cache_versioned=config.prefix_cache_versioned,
                block_size=config.kv_block_size,
                lm_head_precision=config.rollout_lm_head,
            )
        # -1: the engine holds the seed init, not yet any learner version (SFT may have moved version 0)
        self.version = -1
        self._engine_to_learner: dict[int, int] = {}
        self.inflight_stats: dict[str, int | None] = {}

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if version == self.version:
            return
        self.engine.update_weights(weights, mode=self.config.update_mode)
        self._engine_to_learner[self.engine.weight_version] = version
        self.version = version

    def close(self) -> None:
        """Stop the engine's processes (the vLLM engine's; the project engine has none)."""
        if hasattr(self.engine, "shutdown"):
            self.engine.shutdown()

    def cache_stats(self) -> dict[str, int]:
        """The engine's prefix-cache counters, as both executors put them in the run summary."""
        if hasattr(self.engine, "cache_stats"):  # (the vLLM engine counts what vLLM reports)
            return self.engine.cache_stats()
        manager = self.engine.block_manager
        return {"prefix_cache_hits": manager.hits, "stale_prefix_hits": manager.stale_hits}

    def generate(self, batch_index: int, split: str = "train", greedy: bool = False, seeds=None,
                 inflight: tuple[dict[str, torch.Tensor], int] | None = None):  # fmt: skip
        """Batch ``batch_index``'s episodes; ``inflight`` = (weights, version): an update that lands
        after ``config.inflight_update_at_token`` engine steps of the batch (rl/inflight.py), reported
        by ``inflight_stats``."""
        c = self.config
        task_seeds = seeds if seeds is not None else task_seeds_for_batch(c, batch_index)
        update = None
        if inflight is not None and inflight[1] != self.version:
            weights, version = inflight
            update = InflightUpdate(c.inflight_update_at_token, lambda: self.set_weights(weights, version))
        episodes = collect_episodes(
            self.engine,
            c.env,
            task_seeds,
            1 if greedy else c.group_size,
            batch_index=batch_index,
            run_seed=c.seed,
            temperature=0.0 if greedy else c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
            max_new_tokens=c.max_new_tokens,
            logprobs_mode=c.logprobs_mode,
            split=split,
            env_options=env_options(c),
            inflight=update,
        )
        self.inflight_stats = {
            "inflight_update_at_step": None if update is None else update.applied_at_step,
            "inflight_regenerated_requests": 0 if update is None else update.regenerated,
        }
        for ep in episodes:
            ep.versions = [self._engine_to_learner.get(v, v) if v >= 0 else v for v in ep.versions]
        return episodes


def env_options(config: RLConfig) -> dict:
    options = dict(config.env_options)
    if config.env == "desktop":
        options["step_latency_s"] = config.step_latency_s
    return options


def task_seeds_for_batch(config: RLConfig, batch_index: int) -> list[int]:
    """Train-split task seeds of RL batch ``batch_index``: past the ``sft_steps * sft_batch`` seeds the warm
    start used. Different seeds can draw the same task, so this does NOT keep demonstrated prompts out of
    RL: where an env has few distinct train tasks most RL prompts were demonstrated (measured in session 7:
    arithmetic 90%, pipelinerl 100%, desktop 68%, osworld mini 92%; tools and code_repair 0% -- exact prompts
    only). The train reward curves then partly measure recall. Held-out pass@1 on the eval split does not:
    no eval task shares its split key (what decides its answer) with a training task (``Env.split_key``;
    until session 13 code_repair's fixes and arithmetic's commuted operands leaked, docs/learnability.md)."""
    start = config.sft_steps * config.sft_batch + batch_index * config.prompts_per_step
    return list(range(start, start + config.prompts_per_step))


EVAL_BATCH_INDEX = 2**40  # sampling seeds of the sampled eval: a batch index no training step reaches


EVAL_SEED_TRIES = 100  # eval seeds walked per distinct held-out task before giving up


def eval_task_seeds(config: RLConfig) -> list[int]:
    """The first ``eval_size`` eval-split seeds whose prompts are all different.

    Seeds draw tasks independently, so the plain first ``eval_size`` seeds repeat tasks wherever the
    held-out space is small (desktop: one settings task 11 times in 64), and pass@1 weighted them
    by chance. A held-out space smaller than ``eval_size`` is one clear error, not a padded set."""
    env = make_env(config.env, **env_options(config))
    seeds, prompts = [], set()
    for seed in range(config.eval_size * EVAL_SEED_TRIES):
        prompt = env.task(seed, "eval").prompt
        if prompt not in prompts:
            prompts.add(prompt)
            seeds.append(seed)
            if len(seeds) == config.eval_size:
                return seeds
    raise ValueError(
        f"eval_size {config.eval_size}: the {config.env} env's eval split gave only {len(seeds)} distinct "
        f"tasks in {config.eval_size * EVAL_SEED_TRIES} seeds; lower eval_size"
    )


def evaluate(config: RLConfig, learner: Learner) -> dict:
    """Held-out pass@1 on ``eval_size`` distinct eval-split tasks under the learner's weights.

    ``eval_pass_at_1``: share of prompts whose greedy (temperature 0) episode solves the task (reward 1,
    or the env's own grading where it has one: code repair's hidden tests).
    ``eval_sampled_pass_at_1`` (when ``eval_samples`` = n > 0): n episodes per prompt sampled with the
    training temperature/top-k/top-p; the unbiased pass@1 estimate c/n per prompt, averaged over prompts
    (the metric RL optimises directly; greedy pass@1 only moves when an answer's argmax flips).
    """
    from ..engine import LLM

    # the learner's weights served by an engine in the rollout's numerics (dtype, format, KV cache, head):
    # a baseline's policy is evaluated as it samples
    model = build_policy(config, "rollout")
    model.load_state_dict_hf(state_snapshot(learner.model))
    engine = LLM(
        model, kernels=config.engine_kernels, max_num_seqs=64, kv_cache_dtype=config.kv_cache_dtype,
        lm_head_precision=config.rollout_lm_head,
    )  # fmt: skip
    start = time.perf_counter()
    seeds = eval_task_seeds(config)
    common = dict(batch_index=EVAL_BATCH_INDEX, run_seed=config.seed, max_new_tokens=config.max_new_tokens,
                  split="eval", env_options=env_options(config))  # fmt: skip
    episodes = collect_episodes(engine, config.env, seeds, 1, temperature=0.0, **common)
    rewards = [ep.reward for ep in episodes]
    result = {
        "eval_pass_at_1": sum(ep.solved for ep in episodes) / len(episodes),
        "eval_reward_mean": sum(rewards) / len(rewards),
    }
    if config.eval_samples:
        sampled = collect_episodes(
            engine, config.env, seeds, config.eval_samples, temperature=config.temperature,
            top_k=config.top_k, top_p=config.top_p, logprobs_mode=config.logprobs_mode, **common,
        )  # fmt: skip
        sampled_rewards = [ep.reward for ep in sampled]
        result["eval_sampled_pass_at_1"] = sum(ep.solved for ep in sampled) / len(sampled)
        result["eval_sampled_reward_mean"] = sum(sampled_rewards) / len(sampled_rewards)
    result["time_eval_s"] = time.perf_counter() - start
    return result


def run_sft(config: RLConfig, learner: Learner, progress=None) -> list[float]:
    losses = []
    for step in range(config.sft_steps):
        options = {k: v for k, v in env_options(config).items() if k != "step_latency_s"}
        seed = step * config.sft_batch
        data = demonstration_tokens(config.env, config.sft_batch, seed=seed, env_options=options)
        losses.append(learner.sft_step(data, config.sft_lr))
        if progress is not None:
            progress(f"sft {step + 1}/{config.sft_steps} loss {losses[-1]:.3f}")
    return losses


class WeightHistory:
    """Snapshots of learner weights by version, kept while a future batch may still need them."""

    def __init__(self):
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def put(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self.snapshots[version] = weights

    def get(self, version: int) -> dict[str, torch.Tensor]:
        if version not in self.snapshots:
            raise KeyError(f"weights of version {version} were not kept (have {sorted(self.snapshots)})")
        return self.snapshots[version]

    def prune(self, oldest_needed: int) -> None:
        for version in [v for v in self.snapshots if v < oldest_needed]:
            del self.snapshots[version]


class Run:
    """One training run writing to ``out_dir``: metrics.jsonl, summary.json, provenance.json,
    config.json, checkpoints/ — resumable from its last checkpoint.

    While it runs it holds ``out_dir``'s lock (``io.directory_lock``): a second run on the same directory
    fails at once. Everything that can fail up front (config, kernel sets, both sides' models, the
    checkpoint a resume continues from) is checked before the first write, and a start that fails
    before config.json exists removes the directory it created. provenance.json keeps the first start's
    record at its top level; each resume appends its own record to its ``restarts`` list."""

    def __init__(self, config: RLConfig, out_dir: str | os.PathLike, quiet: bool = False):
        self.config = config
        self.out = Path(out_dir)
        self.quiet = quiet
        self.metrics_path = self.out / "metrics.jsonl"
        self.ckpt_dir = self.out / "checkpoints"

    # ---- bookkeeping ----------------------------------------------------------------------------
    def _log(self, record: dict) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _truncate_metrics(self, keep_before_step: int) -> None:
        if not self.metrics_path.exists():
            return
        lines = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        records = []
        for index, line in enumerate(lines):
            try:
                records.append((line, json.loads(line)))
            except json.JSONDecodeError:
                # a kill in the middle of _log's write leaves a partial last line; its step reruns
                if index != len(lines) - 1:
                    raise ValueError(f"{self.metrics_path}: line {index + 1} is not JSON") from None
        kept = [line for line, record in records if record.get("step", -1) < keep_before_step]
        atomic_write_text(self.metrics_path, "".join(line + "\n" for line in kept))

    def _save(self, step: int, learner: Learner, history: WeightHistory, extra: dict) -> None:
        state = {**learner_state(learner), "history": history.snapshots, "extra": extra}
        self._write_checkpoint(step, state)

    def _write_checkpoint(self, step: int, state: dict) -> None:
        """``state``: ``RESUME_KEYS`` (the Ray executor builds it from its actors' parts)."""
        ckpt.save_checkpoint(self.ckpt_dir, step, state, {"config": self.config.to_dict()})
        if self.config.keep_checkpoints:
            # step 0 is the warm start `zm parity --checkpoint` measures baselines on: never pruned
            ckpt.prune_checkpoints(self.ckpt_dir, self.config.keep_checkpoints, always_keep=(0,))

    def _holding_run_dir(self, start: Callable[[], dict]) -> dict:
        """``start()`` under the run directory's lock; a start that fails before writing config.json
        leaves no directory it created (an existing one keeps whatever it held)."""
        created = not self.out.exists()
        try:
            with directory_lock(self.out, "run"):
                return start()
        except BaseException:
            if created and not (self.out / "config.json").exists():
                with contextlib.suppress(OSError):
                    self.out.rmdir()  # empty unless something else wrote there meanwhile: then kept
            raise

    def _previous_provenance(self) -> dict | None:
        """The provenance.json a resume appends to (None when there is none)."""
        path = self.out / "provenance.json"
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is unreadable ({err}); a resume appends to it") from None
        if not isinstance(record, dict) or not isinstance(record.get("restarts", []), list):
            raise ValueError(f"{path} is no provenance record (a JSON object with a 'restarts' list)")
        return record

    def _write_start(
        self,
        record: dict,
        previous: dict | None,
        resumed_from: Path | None,
        step: int,
        reason: str | None = None,
    ) -> None:
        """config.json and provenance.json of this (re)start: a first start's record is the file; a
        resume's is appended to ``restarts`` (with when it started, where from and, for a restart the run
        made itself, why)."""
        atomic_write_json(self.out / "config.json", self.config.to_dict())
        if previous is not None:
            restart = {
                **record,
                "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "resumed_from": str(resumed_from) if resumed_from else None,
                "resumed_at_step": step,
                **({"reason": reason} if reason else {}),
            }
            record = {**previous, "restarts": [*previous.get("restarts", []), restart]}
        atomic_write_json(self.out / "provenance.json", record)

    def _restore(self, latest: Path, learner: Learner, history: WeightHistory) -> dict:
        """Load the resumable checkpoint ``latest`` into ``learner``/``history`` and the RNGs; its extra."""
        state = load_resumable(latest)
        restore_learner(learner, state)
        history.snapshots = state["history"]
        return state["extra"]

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> dict:
        return self._holding_run_dir(lambda: self._run(resume))

    def _start_checks(self, resume: bool) -> tuple[dict | None, Path | None]:
        """What a (re)start continues from -- the previous provenance and the latest checkpoint (None, None
        for a first start) -- once the config and the run directory allow it; raises before any write."""
        c = self.config
        config_path = self.out / "config.json"
        if config_path.exists() and not resume:
            raise FileExistsError(f"{self.out} already holds a run; pass --resume or choose a new --out")
        if resume and config_path.exists():
            saved = RLConfig.from_dict(json.loads(config_path.read_text())).to_dict()
            given = c.to_dict()
            for key in _RESUMABLE_CHANGES:
                saved.pop(key, None), given.pop(key, None)
            if saved != given:
                raise ValueError(f"{config_path} differs from the config given; resume needs the same config")
        previous = self._previous_provenance() if resume else None
        latest = ckpt.latest_checkpoint(self.ckpt_dir) if resume else None
        if latest is not None and c.enable_prefix_caching and not c.prefix_cache_versioned:
            # the engine's cache is not checkpointed: a resumed run could not reuse the stale K/V an
            # uninterrupted one reuses, so it would compute something else (refused before any write)
            raise ValueError(
                f"{self.out}: a run with prefix_cache_versioned=False cannot be resumed (its stale prefix "
                "cache is not checkpointed); rerun it from the start"
            )
        return previous, latest

    def _run(self, resume: bool) -> dict:
        c = self.config
        torch.manual_seed(c.seed)
        previous, latest = self._start_checks(resume)
        eval_task_seeds(c)  # an eval split too small for eval_size fails here, not after the warm start
        # both sides' models are built before anything is written: a kernel set or weight format the
        # model cannot take (NVFP4 on an in-dim that is no multiple of 16) fails here, not after the run began
        learner = (MixedVersionLearner if c.inflight_update_at_token else Learner)(c)
        worker = RolloutWorker(c)
        try:
            return self._train(learner, worker, latest, previous)
        finally:
            worker.close()

    def _train(self, learner, worker, latest: Path | None, previous: dict | None) -> dict:
        """The run proper, once both sides are built and nothing is written yet: provenance, the warm
        start (or the checkpoint ``latest``), then every RL step."""
        from tqdm import tqdm

        c = self.config
        record = _provenance.run_provenance(c)  # resolves the kernel sets (a native build) before any write
        if c.warm_start == "shared":
            record["warm_start"] = provenance_entry(c, self.quiet)

        history = WeightHistory()
        start_step, extra = 0, {}
        if latest is not None:
            # verified and loaded before any write: a corrupt checkpoint fails the resume, changing nothing
            extra = self._restore(latest, learner, history)
            start_step = extra["next_step"]
        self._truncate_metrics(start_step)  # a malformed metrics.jsonl fails before the start is recorded
        self._write_start(record, previous, latest, start_step)
        if latest is None:
            extra = apply_warm_start(c, learner, self.quiet)
            extra["eval_before"] = evaluate(c, learner)
            history.put(0, state_snapshot(learner.model))
            if c.checkpoint_every:
                # the warm-started weights, before any RL update: what `zm parity --checkpoint` measures a
                # stack's mismatch on, and where a resume skips the warm start from
                self._save(0, learner, history, {**extra, "next_step": 0, "cache_stats": {}})

        wandb_run = maybe_wandb(c, self.out)
        bar = tqdm(range(start_step, c.steps), disable=self.quiet, desc=f"{c.env}/{c.algo}/lag{c.lag}")
        for step in bar:
            version, landing = batch_versions(c, step)
            t0 = time.perf_counter()
            worker.set_weights(history.get(version), version)
            inflight = (history.get(landing), landing) if landing != version else None
            episodes = worker.generate(step, inflight=inflight)
            t1 = time.perf_counter()
            if c.inflight_update_at_token:
                # tokens of two versions: each is scored at its own (MixedVersionLearner)
                snapshot = rollout_snapshots(token_versions(episodes), learner.version, history.get)
            else:
                snapshot = history.get(version) if version != learner.version else None
            stats = learner.rl_step(episodes, snapshot)
            t2 = time.perf_counter()
            history.put(learner.version, state_snapshot(learner.model))
            history.prune(c.weight_version_for_batch(step + 1))
            record = step_record(step, version, learner.version, stats, episodes,
                                 {"time_rollout_s": t1 - t0, "time_learner_s": t2 - t1}, c.env)  # fmt: skip
            if c.inflight_update_at_token:
                record.update(worker.inflight_stats, inflight_version=landing)
            if c.evaluates_after_step(step):
                record.update(evaluate(c, learner))
            self._log(record)
            if wandb_run is not None:
                wandb_run.log(record, step=step)
            bar.set_postfix(reward=f"{record.get('reward_mean', 0):.2f}", kl=f"{record['k3_kl']:.1e}")
            if os.environ.get(CRASH_AFTER_STEP_ENV) == str(step):
                os._exit(13)
            if c.checkpoint_every and (step + 1) % c.checkpoint_every == 0:
                counts = add_counts(extra.get("cache_stats", {}), worker.cache_stats())
                progress = {"next_step": step + 1, "cache_stats": counts}
                self._save(step + 1, learner, history, {**extra, **progress})

        summary = summarize(
            self._records(), weights_hash(learner.model), extra["eval_before"], evaluate(c, learner),
            extra.get("sft_losses"), extra,
        )  # fmt: skip
        # counted over the whole run: a resumed run's engine starts its counters at 0
        summary.update(add_counts(extra.get("cache_stats", {}), worker.cache_stats()))
        atomic_write_json(self.out / "summary.json", summary)
        write_manifest(self.out)  # sha256 of every data file: the audit's tamper check
        if wandb_run is not None:
            wandb_run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
            wandb_run.finish()
        return summary

    def _records(self) -> list[dict]:
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]


def step_record(
    step: int, version: int, learner_version: int, stats: dict, episodes, timings: dict, env: str
) -> dict:
    """One metrics.jsonl line; both executors write exactly this shape (``learner_version`` is
    the learner's version after the update). Where ``env`` grades "solved" apart from the reward,
    ``solved_rate`` is the share of the step's episodes that solved their task: the training-time
    score (S1's "SWE-bench Pro score" over training steps), not the reward the loss sees."""
    record = {"step": step, "weight_version": version, "policy_lag": learner_version - 1 - version}
    record.update(stats)
    record.update(mismatch.reward_stats(torch.tensor([ep.reward for ep in episodes])))
    if ENVS[env].grades_apart:
        record["solved_rate"] = sum(ep.solved for ep in episodes) / len(episodes)
    record.update(timings)
    return record


WARM_START_KEYS = ("warm_start", "warm_start_key", "warm_start_sha256")  # apply_warm_start's record


def summarize(
    records: list[dict],
    weights_sha256: str,
    eval_before: dict,
    eval_after: dict,
    sft_losses,
    warm_start: dict | None = None,
) -> dict:
    """summary.json of a finished run, from its per-step records (shared by both executors);
    ``warm_start``: what :func:`apply_warm_start` recorded (its ``WARM_START_KEYS`` are copied)."""
    warm_start = warm_start or {}
    keys = ("diff_max", "diff_mean", "diff_std", "k3_kl")
    summary = {
        "steps": len(records),
        "weights_sha256": weights_sha256,
        **{key: warm_start[key] for key in WARM_START_KEYS if key in warm_start},
        "eval_pass_at_1_before": eval_before["eval_pass_at_1"],
        "eval_pass_at_1_after": eval_after["eval_pass_at_1"],
        "eval_sampled_pass_at_1_before": eval_before.get("eval_sampled_pass_at_1"),
        "eval_sampled_pass_at_1_after": eval_after.get("eval_sampled_pass_at_1"),
        "sft_final_loss": sft_losses[-1] if sft_losses else None,
    }
    for key in keys:
        summary[f"{key}_max_over_steps"] = max_nan_wins(r[key] for r in records)
    # the mismatch the run started from (the warm-started weights, before any RL update moved them):
    # what a baseline's fidelity is judged on
    first = records[0] if records else {}
    summary.update({f"{key}_first_step": first.get(key) for key in keys})
    summary["steps_with_zero_mismatch"] = sum(all(r[k] == 0.0 for k in keys) for r in records)
    summary["is_peak_over_median_max"] = max_nan_wins(r["peak_over_median"] for r in records)
    summary["grad_norm_preclip_max"] = max_nan_wins(r["grad_norm_preclip"] for r in records)
    rewards = [r["reward_mean"] for r in records]
    head = rewards[: max(1, len(rewards) // 5)]
    tail = rewards[-max(1, len(rewards) // 5) :]
    summary["reward_mean_first_fifth"] = sum(head) / len(head) if head else None
    summary["reward_mean_last_fifth"] = sum(tail) / len(tail) if tail else None
    summary["time_total_s"] = sum(r["time_rollout_s"] + r["time_learner_s"] for r in records)
    return summary


def maybe_wandb(config: RLConfig, out: Path):
    if not config.wandb:
        return None
    os.environ.setdefault("WANDB_MODE", "offline")
    import wandb

    return wandb.init(project="zeromismatch", dir=str(out), config=config.to_dict(), mode="offline")


def train(config: RLConfig, out_dir, resume: bool = False, quiet: bool = False) -> dict:
    """Run (or resume) a training run; returns its summary."""
    if config.executor == "ray":
        from .actors import RayRun

        return RayRun(config, out_dir, quiet=quiet).run(resume=resume)
    return Run(config, out_dir, quiet=quiet).run(resume=resume)
