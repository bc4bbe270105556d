"""Tensor-parallel engine: the same engine run SPMD by spawned gloo workers.

``LLM(preset, tp=d)`` spawns d processes that join one gloo process group; each builds
the model with that group as ``tp_group`` (so it holds its shard of every
column/row-parallel weight) and a full single-process engine around it. Every call
(``add_request``, ``step``, ``generate``, ``update_weights``, ...) is sent to all
workers, which execute it in lock-step. Scheduling and sampling are deterministic
functions of the requests and of the logits, and the logits are identical on every
rank after the model's reductions, so the workers' schedulers never diverge; rank 0's
result is returned. Requests that fail validation fail identically on every rank.

``run_spmd(fn, world_size, *args)`` is the lower-level helper (used by the trainer's
TP recompute in tests): it runs ``fn(rank, group, *args)`` in every worker and returns
rank 0's result. ``fn`` must be importable (a module-level function).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from queue import Empty


def _rendezvous() -> tuple[str, str]:
    """``(init_method, directory)``: a file rendezvous in a fresh private directory, removed by the
    caller once its workers are gone. A ``tcp://`` rendezvous on a port found free by binding and
    releasing it (session 14 and before) could lose that port to another process in between."""
    directory = tempfile.mkdtemp(prefix="zm-tp-")
    return "file://" + os.path.join(directory, "rendezvous"), directory


def _init_group(rank: int, world_size: int, init_method: str, threads: int):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    return dist.group.WORLD


def _engine_worker(rank, world_size, init_method, threads, conn, args, kwargs) -> None:
    import torch.distributed as dist

    from .llm import LLM

    try:
        group = _init_group(rank, world_size, init_method, threads)
        llm = LLM(*args, tp=world_size, tp_group=group, **kwargs)
        conn.send(("ok", None))
    except Exception as err:  # report construction failures to the parent
        conn.send(("error", (repr(err), traceback.format_exc())))
        return
    while True:
        method, call_args, call_kwargs = conn.recv()
        if method == "__close__":
            break
        try:
            target = getattr(llm, method)
            result = target(*call_args, **call_kwargs) if callable(target) else target
            conn.send(("ok", result if rank == 0 else None))
        except (ValueError, TypeError) as err:  # bad input: the same on every rank, engine keeps going
            conn.send(("raise", err))
        except Exception as err:
            conn.send(("error", (repr(err), traceback.format_exc())))
    dist.destroy_process_group()
    conn.close()


def _spmd_worker(rank, world_size, init_method, threads, queue, fn, args) -> None:
    """Puts one ``(rank, status, payload)`` reply: ``"ok"`` with rank 0's result (as bytes; None on
    the other ranks) once every rank is through ``fn``, or ``"error"`` with the traceback."""
    import torch
    import torch.distributed as dist

    try:
        group = _init_group(rank, world_size, init_method, threads)
        result = fn(rank, group, *args)
        payload = None
        if rank == 0:
            # serialise to bytes: a tensor put on a Queue travels as a shared-memory handle that
            # dies with this process, which may exit before the parent unpickles it
            buffer = io.BytesIO()
            torch.save(result, buffer)
            payload = buffer.getvalue()
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, "ok", payload))
    except Exception as err:
        queue.put((rank, "error", (repr(err), traceback.format_exc())))


def _replies(queue, procs, timeout: float) -> dict:
    """``{rank: (status, payload)}``: every rank's reply, or up to the first error; a rank that
    exits without one is an error of its own, and so is running past ``timeout`` seconds."""
    replies: dict = {}
    deadline = time.monotonic() + timeout
    exited_at: dict = {}  # rank -> when it was first seen exited without a reply
    while len(replies) < len(procs):
        try:
            rank, status, payload = queue.get(timeout=0.1)
        except Empty:
            now = time.monotonic()
            for r, proc in enumerate(procs):
                if r not in replies and proc.exitcode is not None:
                    exited_at.setdefault(r, now)
                    # a rank flushes its reply before it exits: one still missing a second later
                    # (after further reads) has none
                    if now - exited_at[r] > 1.0:
                        replies[r] = ("error", (f"exited (code {proc.exitcode}) without a result", ""))
                        return replies
            if now > deadline:
                raise TimeoutError(f"tensor-parallel workers gave no result within {timeout:.0f} s") from None
            continue
        replies[rank] = (status, payload)
        if status != "ok":
            return replies
    return replies


def _threads_per_worker(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def run_spmd(fn, world_size: int, *args, timeout: float = 600.0):
    """Run ``fn(rank, group, *args)`` in ``world_size`` spawned gloo workers; rank 0's result."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init_method, rendezvous_dir = _rendezvous()
    threads = _threads_per_worker(world_size)
    procs = [
        ctx.Process(
            target=_spmd_worker, args=(r, world_size, init_method, threads, queue, fn, args), daemon=True
        )
        for r in range(world_size)
    ]
    replies: dict = {}
    try:
        for proc in procs:
            proc.start()
        replies = _replies(queue, procs, timeout)
    finally:
        # after an error the other ranks may wait in a collective that never completes
        failed = len(replies) < world_size or any(status != "ok" for status, _ in replies.values())
        for proc in procs:
            if proc.pid is None:  # never started
                continue
            proc.join(timeout=1 if failed else 30)
            if proc.is_alive():
                proc.terminate()
        shutil.rmtree(rendezvous_dir, ignore_errors=True)
    for rank, (status, payload) in sorted(replies.items()):
        if status != "ok":
            raise RuntimeError(f"tensor-parallel worker {rank} failed: {payload[0]}\n{payload[1]}")
    import torch

    return torch.load(io.BytesIO(replies[0][1]), weights_only=False)


class TensorParallelLLM:
    """Proxy with the ``LLM`` interface whose engine runs in ``tp`` gloo worker processes."""

    def __init__(self, model, kernels="aligned", *, tp: int = 2, **kwargs):
        if not isinstance(model, str):
            raise TypeError("LLM(tp>1) needs a model preset name (each worker builds its own shard)")
        if not isinstance(kernels, str):
            raise TypeError("LLM(tp>1) needs the kernel set by name")
        if kwargs.get("quant") not in (None, "none"):  # one error here, not one per worker
            raise ValueError("LLM(tp>1) cannot quantize: quantize_model does not shard quantized weights")
        if "kv_cache_dtype" in kwargs:  # the workers get it with the other kwargs; checked once, here
            import torch

            from ..kernels.quant import check_kv_cache_dtype

            # (a worker's construction error would come back as a RuntimeError; float32: LLM's default)
            check_kv_cache_dtype(kwargs["kv_cache_dtype"], kwargs.get("dtype", torch.float32))
        if kwargs.get("enable_prefix_caching"):
            # said here, once (in the workers it went once per rank to their stderr, out of the
            # caller's reach); the workers then get None: "where supported"
            from ..models import MODEL_CLASSES, resolve_config
            from .llm import warn_prefix_caching_ignored

            model_class = MODEL_CLASSES[resolve_config(model).family]
            if not getattr(model_class, "supports_prefix_caching", True):
                warn_prefix_caching_ignored(model_class, stacklevel=3)
                kwargs = {**kwargs, "enable_prefix_caching": None}
        ctx = mp.get_context("spawn")
        init_method, self._rendezvous_dir = _rendezvous()
        threads = _threads_per_worker(tp)
        self.tp = tp
        self._conns, self._procs = [], []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_engine_worker,
                args=(rank, tp, init_method, threads, child, (model, kernels), kwargs),
                daemon=True,
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self._collect()

    def _collect(self):
        """One reply per worker. A worker that fails or dies takes the group down at once
        (its peers may be blocked in a collective that will never complete)."""
        replies: list = [None] * len(self._conns)
        while any(r is None for r in replies):
            for rank, (conn, proc) in enumerate(zip(self._conns, self._procs)):
                if replies[rank] is not None:
                    continue
                if conn.poll(0.05):
                    replies[rank] = conn.recv()
                    if replies[rank][0] == "error":
                        payload = replies[rank][1]
                        self.close(force=True)
                        raise RuntimeError(
                            f"tensor-parallel engine worker {rank} failed: {payload[0]}\n{payload[1]}"
                        )
                elif not proc.is_alive():
                    self.close(force=True)
                    raise RuntimeError(f"tensor-parallel engine worker {rank} exited (code {proc.exitcode})")
        for status, payload in replies:
            if status == "raise":
                raise payload
        return replies[0][1]

    def _call(self, method: str, *args, **kwargs):
        if not self._procs:
            raise RuntimeError("this tensor-parallel engine is closed")
        for conn in self._conns:
            conn.send((method, args, kwargs))
        return self._collect()

    def add_request(self, *args, **kwargs):
        return self._call("add_request", *args, **kwargs)

    def step(self):
        return self._call("step")

    def has_unfinished(self) -> bool:
        return self._call("has_unfinished")

    def abort(self, request_id):
        return self._call("abort", request_id)

    def generate(self, *args, **kwargs):
        return self._call("generate", *args, **kwargs)

    def update_weights(self, *args, **kwargs):
        return self._call("update_weights", *args, **kwargs)

    def prefix_cache_hits(self) -> int:
        return self._call("prefix_cache_hits")

    @property
    def weight_version(self) -> int:
        return self._call("weight_version")

    @property
    def max_model_len(self) -> int:
        return self._call("max_model_len")

    @property
    def vocab_size(self) -> int:
        return self._call("vocab_size")

    @property
    def num_steps(self) -> int:
        return self._call("num_steps")

    @property
    def num_preemptions(self) -> int:
        return self._call("num_preemptions")

    @property
    def block_manager(self):
        """A snapshot (a copy sent from rank 0) of the engine's block manager: its counters and
        free blocks as of this call."""
        return self._call("block_manager")

    @property
    def num_generated_tokens(self) -> int:
        return self._call("num_generated_tokens")

    def close(self, force: bool = False) -> None:
        for conn in self._conns:
            try:
                if not force:
                    conn.send(("__close__", (), {}))
            except (OSError, BrokenPipeError):
                pass
        for proc in self._procs:
            proc.join(timeout=0 if force else 30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
        self._conns, self._procs = [], []
        if getattr(self, "_rendezvous_dir", None):
            shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
            self._rendezvous_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
