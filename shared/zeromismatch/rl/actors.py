"""The Ray executor: a rollout actor and a learner actor running concurrently.

Same lag schedule and same bits as the in-process executor (``loop.Run``): batch b
is generated with learner weights version v(b) = max(0, b − k). The driver asks the
rollout actor for batch b as soon as version v(b) exists, so with k >= 1 the rollout
of batch s+1 overlaps the learner's update on batch s — the source of the async
speed-up. Each actor gets one CPU and one torch thread; set the in-process run to the
same thread count (``torch.set_num_threads``) when comparing bits across executors.

Records match the in-process executor's: the learner actor runs the mid-run evaluations
(``eval_every``) right after the update they follow, and the summary carries the rollout
actor's prefix-cache counters. The Ray executor neither checkpoints nor logs to wandb
(``RLConfig.validate`` rejects ``checkpoint_every`` > 0 and ``wandb`` with it), it swaps weights between
batches only (``inflight_update_at_token`` > 0 is rejected with it: an update landing inside a batch
would have to reach the rollout actor while its ``generate`` call runs), and it needs
two CPUs in the Ray cluster, one per actor; both actors are killed however the run ends.

A rollout actor that dies (its process killed, its node lost) is restarted by Ray and the batch it
was generating is generated again (``max_restarts`` / ``max_task_retries``): a batch is a function of
(weights v(b), batch index, seed) only and every ``generate`` call carries its weights, so the new
actor's batch has the same bits and no batch is lost or trained twice. The summary counts the
restarts (``rollout_actor_restarts``); its prefix-cache counters cover the last incarnation only. A
run whose prefix cache ignores weight versions (``prefix_cache_versioned=False``, S2's stale-cache
bug) is not restarted: its batches depend on what the lost cache held. The learner actor holds the
optimizer state and is not restarted: its death ends the run (resume needs the in-process executor).

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
from .config import RLConfig
from .learner import Learner, state_snapshot, weights_hash
from .loop import RolloutWorker, Run, eval_task_seeds, evaluate, step_record, summarize
from .warm_start import apply_warm_start, cache_root, provenance_entry

#: tests: ``"<batch>:<marker file>"`` kills the rollout actor's process when it starts that batch, once
#: (the marker file records that it happened), to show the restart path
KILL_ROLLOUT_ENV = "ZM_KILL_ROLLOUT_ACTOR_AT_BATCH"
ROLLOUT_RESTARTS = 3


class _RolloutActor:
    def __init__(self, config_dict: dict, threads: int, kill_at: str | None = None):
        torch.set_num_threads(threads)
        self.worker = RolloutWorker(RLConfig.from_dict(config_dict))
        self.incarnation = uuid.uuid4().hex  # a restarted actor is a new incarnation
        self.kill_at = kill_at

    def generate(self, batch_index: int, version: int, weights: dict):
        if self.kill_at is not None:
            batch, marker = self.kill_at.split(":", 1)
            if int(batch) == batch_index and not Path(marker).exists():
                Path(marker).write_text(self.incarnation)
                os._exit(1)  # a real process death, as a lost node or OOM kill would be
        t0 = time.perf_counter()
        self.worker.set_weights(weights, version)
        episodes = self.worker.generate(batch_index)
        return episodes, time.perf_counter() - t0, self.incarnation

    def cache_stats(self) -> dict[str, int]:
        return self.worker.cache_stats()


class _LearnerActor:
    def __init__(self, config_dict: dict, threads: int):
        torch.set_num_threads(threads)
        self.config = RLConfig.from_dict(config_dict)
        torch.manual_seed(self.config.seed)
        self.learner = Learner(self.config)
        self.last_step_end: float | None = None

    def warm_start(self, cache_root: str):
        record = apply_warm_start(self.config, self.learner, root=Path(cache_root))
        return record, evaluate(self.config, self.learner), state_snapshot(self.learner.model)

    def step(self, rollout_output, snapshot, evaluate_after: bool = False):
        # Ray resolves ``rollout_output`` before this call starts, so the gap since the previous
        # step ended is exactly the time this learner sat idle waiting for its batch
        t0 = time.perf_counter()
        idle = 0.0 if self.last_step_end is None else t0 - self.last_step_end
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


ACTOR_CPUS = 2  # one rollout actor and one learner actor, one CPU each


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


class RayRun(Run):
    """``Run`` with the rollout and the learner in separate Ray actors. It writes no
    checkpoints and cannot be resumed: use executor='inprocess' for resumable runs. Like ``Run`` it
    holds the run directory's lock and checks everything it can before its first write."""

    def run(self, resume: bool = False, threads_per_actor: int = 1) -> dict:
        if resume:
            raise ValueError(
                "the Ray executor does not checkpoint; use executor='inprocess' for resumable runs"
            )
        return self._holding_run_dir(lambda: self._run_ray(threads_per_actor))

    def _run_ray(self, threads_per_actor: int) -> dict:
        import ray

        c = self.config
        if (self.out / "config.json").exists():
            raise FileExistsError(f"{self.out} already holds a run; use a new --out")
        eval_task_seeds(c)
        # The actors build these same models from the same config; built here first, a model, kernel set
        # or weight format that cannot work fails as itself (an actor's failure reaches the driver only as
        # a RayActorError) and before anything is written. They are tiny at the scales this executor runs.
        Learner(c)
        RolloutWorker(c).close()  # (a vLLM rollout engine is started once here, and stopped)
        record = _provenance.run_provenance(c)
        if c.warm_start == "shared":
            record["warm_start"] = provenance_entry(c, self.quiet)
        init_ray()
        _check_cluster_cpus()
        atomic_write_json(self.out / "config.json", c.to_dict())
        atomic_write_json(self.out / "provenance.json", record)
        self._truncate_metrics(0)
        restarts = ROLLOUT_RESTARTS if c.prefix_cache_versioned or not c.enable_prefix_caching else 0
        restartable = ray.remote(num_cpus=1, max_restarts=restarts, max_task_retries=restarts)
        kill_at = os.environ.get(KILL_ROLLOUT_ENV)
        rollout = restartable(_RolloutActor).remote(c.to_dict(), threads_per_actor, kill_at)
        learner = ray.remote(num_cpus=1)(_LearnerActor).remote(c.to_dict(), threads_per_actor)
        try:
            return self._drive(rollout, learner)
        finally:
            # a failed run must not keep both CPUs: the next Ray run in this process would wait forever
            for actor in (rollout, learner):
                ray.kill(actor)

    def _drive(self, rollout, learner) -> dict:
        import ray
        from tqdm import tqdm

        c = self.config
        # the driver's cache (its checkout's runs/warm_starts): an actor's working directory may be another
        warm, eval_before, weights0 = ray.get(learner.warm_start.remote(str(cache_root())))
        # The whole step graph is submitted as object references, so neither actor ever waits
        # on the driver: rollout b depends on the weights output of learner step v(b) − 1,
        # learner step s on rollout s, and Ray runs each actor's calls in submission order.
        # With lag k >= 1 the rollout actor therefore runs up to k batches ahead while the
        # learner trains. The driver only keeps a window of k + 2 steps in flight and
        # collects each step's record when it falls out of the window.
        weights = {0: ray.put(weights0)}
        in_flight: deque = deque()
        bar = tqdm(total=c.steps, disable=self.quiet, desc=f"ray {c.env}/{c.algo}/lag{c.lag}")

        incarnations: set[str] = set()

        def collect() -> None:
            step, version, rollout_ref, record_ref = in_flight.popleft()
            (stats, timings, evaluation), (episodes, _, incarnation) = ray.get([record_ref, rollout_ref])
            incarnations.add(incarnation)
            record = step_record(step, version, step + 1, stats, episodes, timings, c.env)
            record.update(evaluation)
            self._log(record)
            bar.update(1)
            bar.set_postfix(reward=f"{record.get('reward_mean', 0):.2f}")

        wall_start = time.perf_counter()
        for step in range(c.steps):
            version = c.weight_version_for_batch(step)
            rollout_ref = rollout.generate.remote(step, version, weights[version])
            snapshot = weights[version] if version != step else None
            record_ref, weights[step + 1] = learner.step.options(num_returns=2).remote(
                rollout_ref, snapshot, c.evaluates_after_step(step)
            )
            in_flight.append((step, version, rollout_ref, record_ref))
            oldest_needed = c.weight_version_for_batch(step + 1)
            for v in [v for v in weights if v < oldest_needed]:
                del weights[v]  # pending tasks that read it keep the object alive
            while len(in_flight) > c.lag + 2:
                collect()
        while in_flight:
            collect()
        bar.close()
        wall = time.perf_counter() - wall_start
        (digest, eval_after), cache_stats = ray.get([learner.finish.remote(), rollout.cache_stats.remote()])
        records = self._records()
        summary = summarize(records, digest, eval_before, eval_after, warm["sft_losses"], warm)
        summary.update(cache_stats)
        summary.update(
            executor="ray",
            rollout_actor_restarts=len(incarnations) - 1,
            time_wall_s=wall,
            learner_steps_per_s=len(records) / wall if wall > 0 else None,
        )
        atomic_write_json(self.out / "summary.json", summary)
        write_manifest(self.out)  # sha256 of every data file: the audit's tamper check
        return summary
