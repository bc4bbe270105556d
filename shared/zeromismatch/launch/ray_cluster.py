"""Ray, locally and across the nodes of a Slurm allocation.

Locally, :func:`init_ray` starts a small private Ray instance: no dashboard, no usage stats, and
``RAY_AUTH_MODE=disabled`` set before ``ray.init`` because Ray 2.60 otherwise turns on token
authentication for every new local cluster and writes a token under ``~/.ray``.

On Slurm (full scale), :func:`ray_slurm_setup_lines` is the sbatch-side recipe. It runs in the batch
script on the first node of the allocation, before the job's own command:

1. writes a fresh random token (mode 0600) into the job folder, which submitit already requires to
   be shared by all nodes, and exports ``RAY_AUTH_MODE=token`` + ``RAY_AUTH_TOKEN_PATH``; ``srun``
   passes the environment to every step, so head, workers and driver all use that token;
2. picks the head's address: ``$ZM_RAY_HEAD_IP`` if set, else the head node's first non-loopback
   address (``hostname -I``: ``hostname --ip-address`` gives 127.0.1.1 on a stock Debian
   ``/etc/hosts``, which no other node can reach), and free ports on it for this job (the GCS and the
   dashboard agent), so two jobs sharing a node do not collide on 6379;
3. starts the Ray head on the first node and waits until it answers ``ray status``, then one Ray
   worker per remaining node, each with the node's GPUs and the task's CPUs. Every ``srun`` names
   ``--cpus-per-task`` (since Slurm 22.05 a step no longer inherits it from the job) and
   ``--overlap`` (the steps share the job's CPUs); the Ray steps ignore ``SIGUSR2``, the signal
   submitit's checkpoint/requeue protocol sends to every step of the job;
4. exports ``ZM_RAY_ADDRESS`` and arms ``ray stop`` on every node at the script's exit (a trap, so
   it runs when the head fails to start or the driver fails too). The job's command then runs as
   one ``srun`` step on the head node (:func:`ray_driver_srun_args`): the Ray driver, and the step
   that receives ``SIGUSR2`` (submitit's handler checkpoints a checkpointable job and requeues it).
   :func:`init_ray` connects to the address and waits until all ``SLURM_JOB_NUM_NODES`` nodes have
   joined (the workers' readiness wait).

The recipe runs here on the Slurm of cluster/local_slurm: on one node (tests/cluster/test_cluster_slurm.py
and the full-smoke tests) and on two (its partition ``twin``, two more slurmd on the same machine: a
head and a worker that joins, the driver waiting for both); GPU counts are checked in the dry-run
text only.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

RAY_ADDRESS_ENV = "ZM_RAY_ADDRESS"
RAY_HEAD_IP_ENV = "ZM_RAY_HEAD_IP"  # overrides the head address the recipe picks


def _ray_environment() -> None:
    # setdefault: a caller (or the Slurm recipe's RAY_AUTH_MODE=token) that chose a mode keeps it.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def init_ray(
    num_cpus: int = 2,
    object_store_memory: int = 200 * 1024**2,
    address: str | None = None,
    expected_nodes: int | None = None,
    wait_timeout_s: float = 300.0,
):
    """Start (or join) Ray and return the ``ray.init`` context.

    ``address=None`` reads ``$ZM_RAY_ADDRESS`` (set by the Slurm recipe); if that is unset too, a
    local instance with ``num_cpus`` CPUs and ``object_store_memory`` bytes of object store starts.
    When joining, waits until ``expected_nodes`` (default ``$SLURM_JOB_NUM_NODES``, else 1) are alive.
    Calling it while Ray is already initialised in this process raises ``RuntimeError``.
    """
    if not isinstance(num_cpus, int) or isinstance(num_cpus, bool) or num_cpus < 1:
        raise ValueError(f"num_cpus must be an integer >= 1, got {num_cpus!r}")
    # Ray's own floor for the object store is 75 MiB.
    if not isinstance(object_store_memory, int) or object_store_memory < 75 * 1024**2:
        raise ValueError(
            f"object_store_memory must be an integer >= 75 MiB in bytes, got {object_store_memory!r}"
        )
    _ray_environment()
    import ray

    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; call ray.shutdown() first")
    address = address or os.environ.get(RAY_ADDRESS_ENV)
    if address is None:
        return ray.init(
            num_cpus=num_cpus,
            object_store_memory=object_store_memory,
            include_dashboard=False,
            log_to_driver=False,
        )
    context = ray.init(address=address, log_to_driver=False)
    if expected_nodes is None:
        expected_nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    wait_for_nodes(expected_nodes, timeout_s=wait_timeout_s)
    return context


def wait_for_nodes(expected_nodes: int, timeout_s: float = 300.0, poll_s: float = 1.0) -> int:
    """Block until at least ``expected_nodes`` Ray nodes are alive; return how many are."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        alive = sum(1 for node in ray.nodes() if node.get("Alive"))
        if alive >= expected_nodes:
            return alive
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {alive} of {expected_nodes} Ray nodes joined within {timeout_s} s")
        time.sleep(poll_s)


def _ray_executable() -> str:
    # The ray console script installed next to this interpreter (same venv on every node).
    candidate = Path(sys.executable).parent / "ray"
    return shlex.quote(str(candidate)) if candidate.exists() else "ray"


#: picks n free TCP ports on the node it runs on (bound together, so they differ), printed on one line
_FREE_PORTS = (
    "import socket as s; n = 2; socks = [s.socket() for _ in range(n)]; "
    "[k.bind(('0.0.0.0', 0)) for k in socks]; print(*[k.getsockname()[1] for k in socks])"
)


def ray_slurm_setup_lines(
    job_folder: str | os.PathLike,
    gpus_per_node: int,
    port: int | None = None,
    head_timeout_s: int = 120,
) -> list[str]:
    """Shell lines (submitit's ``setup``) that start a Ray cluster over the job's nodes.

    ``port``: the head's GCS port; None (the default) picks a free one on the head node when the job
    starts. The job must run one task per node (``tasks_per_node=1``), and its command must run as
    one srun step on the head node (:func:`ray_driver_srun_args`).
    """
    if not isinstance(gpus_per_node, int) or gpus_per_node < 0:
        raise ValueError(f"gpus_per_node must be an integer >= 0, got {gpus_per_node!r}")
    if port is not None and (not isinstance(port, int) or not 1024 <= port <= 65535):
        raise ValueError(f"port must be an integer in 1024..65535, got {port!r}")
    ray_bin = _ray_executable()
    python = shlex.quote(sys.executable)
    # Quoted for the shell, except the ${SLURM_JOB_ID} suffix, which must expand.
    folder = shlex.quote(str(Path(job_folder).expanduser().absolute()))
    token_path = folder + "/ray_auth_token_${SLURM_JOB_ID}"
    # a Ray step ignores SIGUSR2 (inherited through exec by every Ray process it starts): the signal
    # is for the driver step, whose submitit handler checkpoints and requeues the job
    ignore_usr2 = 'bash -c \'trap "" USR2; exec "$0" "$@"\''
    ports = 'read -r zm_ray_port zm_ray_agent_port <<< "$(zm_ray_step "$node" '
    ports += f'{python} -c {shlex.quote(_FREE_PORTS)})"'
    if port is not None:
        ports += f"; zm_ray_port={port}"
    first_address = "zm_ray_step \"$node\" hostname -I | awk '{print $1}'"
    head_ip = f'zm_ray_head_ip="${{{RAY_HEAD_IP_ENV}:-$({first_address})}}"'
    return [
        "# Ray cluster over this allocation (zeromismatch.launch.ray_cluster.ray_slurm_setup_lines)",
        "export RAY_USAGE_STATS_ENABLED=0",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH={token_path}",
        f"(umask 077 && {python} -c 'import secrets; print(secrets.token_hex(32))' "
        '> "$RAY_AUTH_TOKEN_PATH")',
        'zm_ray_nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'zm_ray_cpus="${SLURM_CPUS_PER_TASK:-1}"',
        'zm_ray_step() { srun --nodes=1 --ntasks=1 --overlap --cpus-per-task="$zm_ray_cpus" -w "$@"; }',
        "zm_ray_stop() {",
        "  local pids=() node",
        '  for node in "${zm_ray_nodes[@]}"; do',
        f'    zm_ray_step "$node" {ray_bin} stop --force >/dev/null 2>&1 & pids+=($!)',
        "  done",
        '  wait "${pids[@]}"',
        '  rm -f "$RAY_AUTH_TOKEN_PATH"',
        "}",
        "trap zm_ray_stop EXIT",
        "node=${zm_ray_nodes[0]}",
        head_ip,
        ports,
        f'export {RAY_ADDRESS_ENV}="$zm_ray_head_ip:$zm_ray_port"',
        f'zm_ray_step "$node" {ignore_usr2} {ray_bin} start --head --node-ip-address="$zm_ray_head_ip" '
        '--port="$zm_ray_port" '
        '--dashboard-agent-listen-port="$zm_ray_agent_port" '
        f'--num-cpus="$zm_ray_cpus" --num-gpus={gpus_per_node} --include-dashboard=false --block &',
        f"for _ in $(seq {head_timeout_s}); do "
        f'{ray_bin} status --address="${RAY_ADDRESS_ENV}" >/dev/null 2>&1 && break; sleep 1; done',
        f'{ray_bin} status --address="${RAY_ADDRESS_ENV}" >/dev/null '
        f'|| {{ echo "Ray head did not start at ${RAY_ADDRESS_ENV} within {head_timeout_s} s" >&2; '
        "exit 1; }",
        'for node in "${zm_ray_nodes[@]:1}"; do',
        f'  zm_ray_step "$node" {ignore_usr2} {ray_bin} start --address="${RAY_ADDRESS_ENV}" '
        f'--num-cpus="$zm_ray_cpus" --num-gpus={gpus_per_node} --block &',
        "done",
    ]


def ray_driver_srun_args(cpus_per_task: int) -> list[str]:
    """submitit's ``srun_args`` for the job's command on a Ray allocation: one task on the head node
    (``--relative=0``: the allocation's first node, where the batch script runs and the Ray head is),
    sharing the CPUs the Ray head holds. Fixed words only: submitit quotes each one."""
    if not isinstance(cpus_per_task, int) or cpus_per_task < 1:
        raise ValueError(f"cpus_per_task must be an integer >= 1, got {cpus_per_task!r}")
    return ["--nodes=1", "--ntasks=1", "--relative=0", "--overlap", f"--cpus-per-task={cpus_per_task}"]


def ray_slurm_teardown_lines() -> list[str]:
    """Shell lines (submitit's ``teardown``) after the driver: the job ends with the driver's exit
    status; the EXIT trap of :func:`ray_slurm_setup_lines` stops Ray on every node (without it Slurm
    must signal the blocking ``ray start`` steps, and the job hangs in COMPLETING for KillWait)."""
    return ["zm_driver_status=$?", 'exit "$zm_driver_status"']


def ray_cluster_report() -> dict[str, object]:
    """Join (or start) Ray, run one tiny task on each alive node, shut down; say what was there.

    A smoke job for a fresh allocation: ``submit(ray_cluster_report, cluster="slurm", ray=True, ...)``
    shows whether every node joined with its GPUs before a long run is launched.
    """
    import socket

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    init_ray()
    try:
        nodes = [node for node in ray.nodes() if node.get("Alive")]

        @ray.remote(num_cpus=1)
        def where() -> tuple[str, str | None]:
            # the Slurm node whose srun started this Ray node (its raylet's environment)
            return socket.gethostname(), os.environ.get("SLURMD_NODENAME")

        # one task pinned to each Ray node
        pinned = [
            where.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote()
            for node in nodes
        ]
        places = ray.get(pinned)
        return {
            "alive_nodes": len(nodes),
            "resources": {key: float(value) for key, value in ray.cluster_resources().items()},
            "task_hosts": sorted(host for host, _ in places),
            "task_slurm_nodes": sorted(str(node) for _, node in places),
        }
    finally:
        ray.shutdown()
