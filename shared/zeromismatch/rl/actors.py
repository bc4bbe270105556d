"""The Ray executor: a rollout actor and a learner actor running concurrently.

Same lag schedule and same bits as the in-process executor (``loop.Run``): batch b
is generated with learner weights version v(b) = max(0, b − k). The driver asks the
rollout actor for batch b as soon as version v(b) exists, so with k >= 1 the rollout
of batch s+1 overlaps the learner's update on batch s — the source of the async
speed-up. Each actor gets one CPU and one torch thread; set the in-process run to the
same thread count (``torch.set_num_threads``) when comparing bits across executors.

Records match the in-process executor's: the learner actor runs the mid-run evaluations
(``eval_every``) right after the update they follow, and the summary carries the rollout
actor's prefix-cache counters. It swaps weights between batches only (``inflight_update_at_token``
> 0 is rejected with it: an update landing inside a batch would have to reach the rollout actor while
its ``generate`` call runs), and it needs two CPUs in the Ray cluster, one per actor; both actors are
killed however the run ends.

Checkpoints (``checkpoint_every``) are the in-process executor's files, bit for bit the same kind: the
driver asks the learner actor for its state right after the update a checkpoint follows (an actor runs
its calls in submission order, so that is the state after exactly that step, however far the rollout
actor has run ahead), and writes it with the weight versions the next batches need once that step's
record is logged. So ``resume=True`` continues a killed Ray run bitwise, and a learner actor that dies
mid-run (its process killed, its node lost) is replaced by a new one restored from the last checkpoint
(up to ``LEARNER_RESTARTS`` times; provenance records each, ``learner_restarts`` counts them): the
steps after that checkpoint are rolled out and trained again, their records replaced, so every step
is logged once. Without checkpoints a dead learner ends the run.

A rollout actor that dies is restarted by Ray and the batch it was generating is generated again
(``max_restarts`` / ``max_task_retries``): a batch is a function of (weights v(b), batch index, seed)
only and every ``generate`` call carries its weights, so the new actor's batch has the same bits and no
batch is lost or trained twice. The summary counts the restarts (``rollout_actor_restarts``, in the
last start of the run); its prefix-cache counters cover each incarnation from its start only. A run
whose prefix cache ignores weight versions (``prefix_cache_versioned=False``, S2's stale-cache bug) is
neither restarted nor resumed: its batches depend on what the lost cache held.

Both actors run in one placement group per run (``ACTOR_BUNDLES``, one bundle each), reserved before
either starts and released when the run ends.

Ray is started by ``zeromismatch.launch.ray_cluster.init_ray`` (auth token off, no dashboard;
it joins a Slurm-started cluster when ``$ZM_RAY_ADDRESS`` is set).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import deque
from pathlib import Path

import torch

from .. import _provenance
from ..io import atomic_write_json
from ..manifest import write_manifest
from ..train import checkpoint as ckpt
from .config import RLConfig
from .learner import Learner, state_snapshot, weights_hash
from .loop import RolloutWorker, Run, eval_task_seeds, evaluate, maybe_wandb, step_record, summarize
from .resume_state import CRASH_AFTER_STEP_ENV, add_counts, learner_state, load_resumable, restore_learner
from .warm_start import apply_warm_start, cache_root, provenance_entry

#: tests: ``"<batch>:<marker file>"`` kills the rollout actor's process when it starts that batch, once
#: (the marker file records that it happened), to show the restart path
KILL_ROLLOUT_ENV = "ZM_KILL_ROLLOUT_ACTOR_AT_BATCH"
#: tests: ``"<step>:<marker file>"`` kills the learner actor's process in the middle of that step (after
#: its batch arrived, before the update), once
KILL_LEARNER_ENV = "ZM_KILL_LEARNER_ACTOR_AT_STEP"
ROLLOUT_RESTARTS = 3
LEARNER_RESTARTS = 3


def _kill_once(spec: str | None, index: int, incarnation: str) -> None:
    """``os._exit`` -- a real process death, as a lost node or an OOM kill would be -- when ``spec``
    (``"<index>:<marker>"``) names ``index`` and its marker file does not exist yet."""
    if spec is None:
        return
    at, marker = spec.split(":", 1)
    if int(at) == index and not Path(marker).exists():
        Path(marker).write_text(incarnation)
        os._exit(1)


class _RolloutActor:
    def __init__(self, config_dict: dict, threads: int, kill_at: str | None = None):
        torch.set_num_threads(threads)
        self.worker = RolloutWorker(RLConfig.from_dict(config_dict))
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new incarnation
        self.kill_at = kill_at

    def generate(self, batch_index: int, version: int, weights: dict):
        _kill_once(self.kill_at, batch_index, self.incarnation)
        t0 = time.perf_counter()
        self.worker.set_weights(weights, version)
        episodes = self.worker.generate(batch_index)
        return episodes, time.perf_counter() - t0, self.incarnation

    def cache_stats(self) -> dict[str, int]:
        return self.worker.cache_stats()


class _LearnerActor:
    def __init__(self, config_dict: dict, threads: int, kill_at: str | None = None):
        torch.set_num_threads(threads)
        self.config = RLConfig.from_dict(config_dict)
        torch.manual_seed(self.config.seed)
        self.learner = Learner(self.config)
        self.last_step_end: float | None = None
        self.kill_at = kill_at

    def warm_start(self, cache_root: str):
        record = apply_warm_start(self.config, self.learner, root=Path(cache_root))
        return record, evaluate(self.config, self.learner), state_snapshot(self.learner.model)

    def restore(self, state: dict) -> int:
        restore_learner(self.learner, state)
        return self.learner.version

    def checkpoint_state(self) -> dict:
        return learner_state(self.learner)

    def step(self, rollout_output, snapshot, evaluate_after: bool = False):
        # Ray resolves ``rollout_output`` before this call starts, so the gap since the previous
        # step ended is exactly the time this learner sat idle waiting for its batch
        t0 = time.perf_counter()
        idle = 0.0 if self.last_step_end is None else t0 - self.last_step_end
        _kill_once(self.kill_at, self.learner.version, "learner")  # version == the step about to run
        episodes, rollout_time, _ = rollout_output
        stats = self.learner.rl_step(episodes, snapshot)
        self.last_step_end = time.perf_counter()
        timings = {"time_rollout_s": rollout_time, "time_learner_s": self.last_step_end - t0,
                   "time_wait_rollout_s": idle}  # fmt: skip
        evaluation = {}
        if evaluate_after:  # after the update, as the in-process loop does; not counted as idle time
            evaluation = evaluate(self.config, self.learner)
            self.last_step_end = time.perf_counter()
        return (stats, timings, evaluation), state_snapshot(self.learner.model)

    def finish(self):
        return weights_hash(self.learner.model), evaluate(self.config, self.learner)

    def alive(self) -> bool:
        return True


#: one bundle per actor (rollout, learner), CPUs only: GPUs per actor are not built
ACTOR_BUNDLES = ({"CPU": 1}, {"CPU": 1})
ACTOR_CPUS = sum(bundle["CPU"] for bundle in ACTOR_BUNDLES)


def init_ray(num_cpus: int = ACTOR_CPUS) -> None:
    """Start local Ray for the executor unless this process already has it."""
    import ray

    from ..launch.ray_cluster import init_ray as start_ray

    if not ray.is_initialized():
        start_ray(num_cpus=num_cpus, object_store_memory=256 * 1024**2)


def _check_cluster_cpus() -> None:
    """Fail now instead of waiting forever for an actor that can never be scheduled."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < ACTOR_CPUS:
        raise ValueError(
            f"the Ray executor needs {ACTOR_CPUS} CPUs (one per actor) but the Ray cluster has {cpus}"
        )


def _reserve_actor_bundles(timeout_s: float = 120.0):
    """A placement group holding both actors' resources for the whole run: reserved at once (a run
    never holds half of what it needs while another job holds the rest), kept across a learner
    replacement (the new actor takes the dead one's bundle), released at the end. ``PACK``: both on
    one node when they fit, else spread over the allocation."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(list(ACTOR_BUNDLES), strategy="PACK")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ValueError(
            f"the Ray cluster could not reserve the actors' resources {list(ACTOR_BUNDLES)} "
            f"within {timeout_s} s"
        ) from None
    return group


def _is_dead(actor) -> bool:
    import ray

    try:
        ray.get(actor.alive.remote(), timeout=60)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return True
    return False


class RayRun(Run):
    """``Run`` with the rollout and the learner in separate Ray actors. Like ``Run`` it holds the run
    directory's lock, checks everything it can before its first write, checkpoints every
    ``checkpoint_every`` steps and resumes from its last checkpoint."""

    def run(self, resume: bool = False, threads_per_actor: int = 1) -> dict:
        return self._holding_run_dir(lambda: self._run_ray(resume, threads_per_actor))

    def _run_ray(self, resume: bool, threads_per_actor: int) -> dict:
        c = self.config
        previous, latest = self._start_checks(resume)
        eval_task_seeds(c)
        # The actors build these same models from the same config; built here first, a model, kernel set
        # or weight format that cannot work fails as itself (an actor's failure reaches the driver only as
        # a RayActorError) and before anything is written. They are tiny at the scales this executor runs.
        Learner(c)
        RolloutWorker(c).close()  # (a vLLM rollout engine is started once here, and stopped)
        state = load_resumable(latest) if latest is not None else None  # a bad checkpoint fails here
        record = _provenance.run_provenance(c)
        if c.warm_start == "shared":
            record["warm_start"] = provenance_entry(c, self.quiet)
        init_ray()
        _check_cluster_cpus()
        group = _reserve_actor_bundles()
        try:
            return self._run_actors(group, state, record, previous, latest, threads_per_actor)
        finally:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)

    def _run_actors(self, group, state, record, previous, latest, threads_per_actor: int) -> dict:
        import ray

        c = self.config
        reason = None
        for learner_restarts in range(LEARNER_RESTARTS + 1):
            start_step = state["extra"]["next_step"] if state is not None else 0
            self._truncate_metrics(start_step)
            self._write_start(record, previous, latest, start_step, reason)
            rollout, learner = self._start_actors(group, threads_per_actor)
            try:
                return self._drive(rollout, learner, state, learner_restarts)
            except ray.exceptions.RayActorError:
                # a dead learner actor took the optimizer state with it: start a new one from the last
                # checkpoint, if there is one and restarts are left; anything else ends the run
                latest = ckpt.latest_checkpoint(self.ckpt_dir) if c.checkpoint_every else None
                if latest is None or learner_restarts == LEARNER_RESTARTS or not _is_dead(learner):
                    raise
            finally:
                # a failed run must not keep both CPUs: the next Ray run in this process would wait forever
                for actor in (rollout, learner):
                    ray.kill(actor)
            state = load_resumable(latest)
            previous = self._previous_provenance()
            reason = f"learner actor died; restarted from {latest.name}"
            if not self.quiet:
                print(f"{self.out}: {reason}", flush=True)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_actors(self, group, threads_per_actor: int):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        def bundle(index: int) -> dict:
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            return {"num_cpus": ACTOR_BUNDLES[index]["CPU"], "scheduling_strategy": strategy}

        c = self.config
        restarts = ROLLOUT_RESTARTS if c.prefix_cache_versioned or not c.enable_prefix_caching else 0
        restartable = ray.remote(max_restarts=restarts, max_task_retries=restarts, **bundle(0))
        rollout = restartable(_RolloutActor).remote(
            c.to_dict(), threads_per_actor, os.environ.get(KILL_ROLLOUT_ENV)
        )
        learner = ray.remote(**bundle(1))(_LearnerActor).remote(
            c.to_dict(), threads_per_actor, os.environ.get(KILL_LEARNER_ENV)
        )
        return rollout, learner

    def _drive(self, rollout, learner, state: dict | None, learner_restarts: int) -> dict:
        import ray
        from tqdm import tqdm

        c = self.config
        if state is None:
            # the driver's cache (its checkout's runs/warm_starts): an actor's working directory may differ
            warm, eval_before, weights0 = ray.get(learner.warm_start.remote(str(cache_root())))
            extra = {**warm, "eval_before": eval_before}
            weights = {0: ray.put(weights0)}
            start_step = 0
            if c.checkpoint_every:  # the warm start, as the in-process executor saves it
                parts = ray.get(learner.checkpoint_state.remote())
                progress = {"next_step": 0, "cache_stats": {}}
                self._write_checkpoint(0, {**parts, "history": {0: weights0}, "extra": {**extra, **progress}})
        else:
            extra = state["extra"]
            start_step = extra["next_step"]
            ray.get(learner.restore.remote(state))
            weights = {version: ray.put(snapshot) for version, snapshot in state["history"].items()}
        # The whole step graph is submitted as object references, so neither actor ever waits
        # on the driver: rollout b depends on the weights output of learner step v(b) − 1,
        # learner step s on rollout s, and Ray runs each actor's calls in submission order.
        # With lag k >= 1 the rollout actor therefore runs up to k batches ahead while the
        # learner trains. The driver only keeps a window of k + 2 steps in flight and
        # collects each step's record when it falls out of the window.
        in_flight: deque = deque()
        wandb_run = maybe_wandb(c, self.out)
        bar = tqdm(
            total=c.steps, initial=start_step, disable=self.quiet, desc=f"ray {c.env}/{c.algo}/lag{c.lag}"
        )

        incarnations: set[str] = set()

        def collect() -> None:
            step, version, rollout_ref, record_ref, checkpoint = in_flight.popleft()
            (stats, timings, evaluation), (episodes, _, incarnation) = ray.get([record_ref, rollout_ref])
            incarnations.add(incarnation)
            record = step_record(step, version, step + 1, stats, episodes, timings, c.env)
            record.update(evaluation)
            self._log(record)
            if wandb_run is not None:
                wandb_run.log(record, step=step)
            bar.update(1)
            bar.set_postfix(reward=f"{record.get('reward_mean', 0):.2f}")
            if os.environ.get(CRASH_AFTER_STEP_ENV) == str(step):
                os._exit(13)
            if checkpoint is not None:
                parts_ref, history_refs, cache_ref = checkpoint
                parts, counts = ray.get([parts_ref, cache_ref])
                history = dict(zip(history_refs, ray.get(list(history_refs.values())), strict=True))
                progress = {
                    "next_step": step + 1,
                    "cache_stats": add_counts(extra.get("cache_stats", {}), counts),
                }
                self._write_checkpoint(
                    step + 1, {**parts, "history": history, "extra": {**extra, **progress}}
                )

        wall_start = time.perf_counter()
        try:
            for step in range(start_step, c.steps):
                version = c.weight_version_for_batch(step)
                rollout_ref = rollout.generate.remote(step, version, weights[version])
                snapshot = weights[version] if version != step else None
                record_ref, weights[step + 1] = learner.step.options(num_returns=2).remote(
                    rollout_ref, snapshot, c.evaluates_after_step(step)
                )
                oldest_needed = c.weight_version_for_batch(step + 1)
                for v in [v for v in weights if v < oldest_needed]:
                    del weights[v]  # pending tasks that read it keep the object alive
                checkpoint = None
                if c.checkpoint_every and (step + 1) % c.checkpoint_every == 0:
                    # queued right behind this step on each actor: the state after exactly this step
                    checkpoint = (
                        learner.checkpoint_state.remote(),
                        dict(weights),
                        rollout.cache_stats.remote(),
                    )
                in_flight.append((step, version, rollout_ref, record_ref, checkpoint))
                while len(in_flight) > c.lag + 2:
                    collect()
            while in_flight:
                collect()
        except BaseException:
            if wandb_run is not None:  # a learner restart opens its own wandb run in this process
                wandb_run.finish(exit_code=1)
            raise
        bar.close()
        wall = time.perf_counter() - wall_start
        (digest, eval_after), cache_stats = ray.get([learner.finish.remote(), rollout.cache_stats.remote()])
        records = self._records()
        summary = summarize(records, digest, extra["eval_before"], eval_after, extra.get("sft_losses"), extra)
        summary.update(add_counts(extra.get("cache_stats", {}), cache_stats))
        summary.update(
            executor="ray",
            rollout_actor_restarts=len(incarnations) - 1,
            learner_restarts=learner_restarts,
            time_wall_s=wall,
            learner_steps_per_s=(c.steps - start_step) / wall if wall > 0 else None,
        )
        atomic_write_json(self.out / "summary.json", summary)
        write_manifest(self.out)  # sha256 of every data file: the audit's tamper check
        if wandb_run is not None:
            wandb_run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
            wandb_run.finish()
        return summary
