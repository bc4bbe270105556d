"""Step graphs: one decode step's forward recorded once and replayed, the CPU counterpart of the
CUDA graphs vLLM replays for its decode batches.

Why: a tiny model's decode step spends more time in Python (module calls, argument checks, views,
the ~23 native calls' wrappers) than in its kernels (benchmarks/rollout_breakdown.py). Replaying a
recorded list of the step's data-writing operations skips all of that.

Capture runs ``fn()`` for real (its result is this step's result) while recording, in order:
- every call into the native library (``kernels/native/_build.py``'s entry points), with its exact
  arguments (raw addresses of tensors the graph keeps alive) and its return status;
- every aten op below autograd (a ``TorchDispatchMode``): ops that write data are kept -- in-place
  and ``out=`` ops as they were called, functional ops as a call whose result is copied into the
  tensor the capture produced (so later records, which hold that tensor, read the new values);
  views and ``empty`` allocations write nothing and are dropped.
The graph holds every tensor the capture touched, so no address it recorded is ever reused.
Replay runs the records in order. Each op is the same function on the same shapes and the same
memory, so a replay gives the bits the eager forward gives for the same inputs (tests compare them
with ``torch.equal``, and the engine's parity chain runs with graphs on).

What cannot be recorded refuses the capture (``graph.refused`` says why; the caller runs eagerly): reading
tensor data on the host (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``, ``.numpy()``, creating
a tensor from Python values), because a value read at capture would be replayed as a constant;
random ops; ops whose output shape depends on data. Kernel code that reads data only to *check* it
(and raise) marks the read with ``host_reads_for_checks()``; a replay skips those checks, so its
caller must hand it inputs that passed them at capture's shapes (the engine builds them itself).
A native call whose status at replay differs from capture's (e.g. zm_rope missing its table, or a
bad block id) raises ``ReplayDiverged`` and the caller reruns the step eagerly, which raises the
proper error or takes the fallback the eager path takes.

Graphs are bound to shapes, dtypes, thread count and the memory of their inputs: the caller keys
them on those and copies new inputs into the captured input tensors before ``replay()``. They also
read weights by address (packed GEMM panels): ``Guard`` records every parameter's identity and
in-place version, and a graph whose guard fails must be dropped and recaptured.

Capture patches ``_build.library`` and ``torch.Tensor.tolist``/``numpy`` for its duration: capture
from one thread at a time (the engine is single-threaded).
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .host_reads import host_reads_for_checks, reading_for_checks
from .native import _build

__all__ = ["Guard", "ReplayDiverged", "StepGraph", "capture", "host_reads_for_checks"]


class ReplayDiverged(RuntimeError):
    """A native call returned another status at replay than at capture: rerun the step eagerly."""


#: ops that hand tensor data to Python (or make a tensor from Python values that may hold such data)
_HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.lift_fresh.default,
    torch.ops.aten.lift_fresh_copy.default,
}
#: allocations without contents: nothing to replay (the graph keeps the tensor)
_ALLOCATIONS = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}
_REFUSED_TAGS = tuple(
    getattr(torch.Tag, name)
    for name in ("nondeterministic_seeded", "dynamic_output_shape", "data_dependent_output")
    if hasattr(torch.Tag, name)
)


def _static_index(func, args) -> bool:
    """``t[index_tensors]`` with integer indices: tagged dynamic (a boolean mask's result shape
    depends on data) but its shape follows from the index shapes."""
    if func is not torch.ops.aten.index.Tensor:
        return False
    return all(i is None or not (i.dtype is torch.bool or i.dtype is torch.uint8) for i in args[1])


def _tensors(tree) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result (nested tuples, lists and dicts; the shapes aten
    ops take and return), in order. (torch's pytree does this too, at ~4x the cost a capture pays
    on every op.)"""
    if isinstance(tree, torch.Tensor):
        return [tree]
    found: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            found.append(node)
        elif isinstance(node, tuple | list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
    return found


def _storage_key(tensor: torch.Tensor):
    return tensor.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: StepGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        graph = self.graph
        if func in _HOST_READS or (
            any(tag in func.tags for tag in _REFUSED_TAGS) and not _static_index(func, args)
        ):
            if not reading_for_checks():
                graph.refuse(f"{func} at capture")
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if graph.refused is None:
            try:
                self._record(func, args, kwargs, out)
            except Exception as err:  # noqa: BLE001 - recording must never change what the step computes
                graph.refuse(f"{func} could not be recorded: {type(err).__name__}: {err}")
        return out

    def _record(self, func, args, kwargs, out) -> None:
        graph = self.graph
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        # every tensor stays alive with the graph: records hold raw addresses into some of them
        graph.keep.extend(inputs)
        graph.keep.extend(outputs)
        if reading_for_checks() or func in _ALLOCATIONS:
            return
        unusual = [t.layout for t in inputs + outputs if t.layout is not torch.strided]
        if unusual:  # (an MKL-DNN tensor has no storage whose address a record could hold)
            graph.refuse(f"{func} on a {unusual[0]} tensor")
            return
        if func._schema.is_mutable:
            graph.records.append((_call_op, (func, args, kwargs)))
            return
        input_storages = {_storage_key(t) for t in inputs}
        if outputs and all(_storage_key(t) in input_storages for t in outputs):
            return  # a view: its storage already holds whatever the records write
        if not outputs:
            # (an op of no tensor, such as promote_types, cannot read one)
            if inputs and not isinstance(out, torch.dtype | torch.Size | type(None)):
                graph.refuse(f"{func} returned a {type(out).__name__} to Python at capture")
            return
        graph.records.append(_functional_record(func, args, kwargs, out))


def _call_op(func, args, kwargs) -> None:
    func(*args, **kwargs)


def _call_op_into(func, args, kwargs, outputs) -> None:
    for captured, fresh in zip(outputs, _tensors(func(*args, **kwargs))):
        captured.copy_(fresh)


def _call_op_copy(func, args, kwargs, output) -> None:
    output.copy_(func(*args, **kwargs))


@functools.cache
def _out_overload(func):
    """The ``out=`` overload of functional ``func`` (its arguments plus ``out``), or None."""
    names = [a.name for a in func._schema.arguments]
    for overload in func.overloadpacket.overloads():
        candidate = getattr(func.overloadpacket, overload)
        arguments = candidate._schema.arguments
        if [a.name for a in arguments] == [*names, "out"] and arguments[-1].is_out:
            return candidate
    return None


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.stride() != b.stride():
        return False
    if a.dtype is torch.bool or not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _functional_record(func, args, kwargs, out):
    """Replaying ``out = func(*args)``: through its ``out=`` overload writing the captured tensor in
    place when there is one and it gives the captured bytes here (checked once, at capture), else
    the call and a copy into the captured tensor."""
    if isinstance(out, torch.Tensor):
        out_func = _out_overload(func)
        if out_func is not None:
            probe = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
            try:
                # (a refusal's message may print a tensor: not a host read the graph depends on)
                with host_reads_for_checks():
                    out_func(*args, **kwargs, out=probe)
            except (RuntimeError, TypeError):
                out_func = None
            if out_func is not None and _same_bytes(probe, out):
                return (_call_op, (out_func, args, {**kwargs, "out": out}))
        return (_call_op_copy, (func, args, kwargs, out))
    return (_call_op_into, (func, args, kwargs, _tensors(out)))


class _RecordingLibrary:
    """The native library as capture sees it: each entry point called and recorded."""

    def __init__(self, library, graph: StepGraph):
        self._library, self._graph = library, graph
        # the tensor-level silu_mul reads tensors in C; its pointer-level path records the same call
        self.silu_mul_tensors = None

    def __getattr__(self, name):
        function = getattr(self._library, name)
        if name not in _build.ENTRY_POINTS:
            return function
        graph = self._graph

        def record(*args):
            status = function(*args)
            if not reading_for_checks():
                graph.records.append((_call_native, (function, args, status, name)))
            return status

        return record


def _call_native(function, args, status, name) -> None:
    got = function(*args)
    if got != status:
        raise ReplayDiverged(f"native {name} returned {got!r} at replay, {status!r} at capture")


class Guard:
    """Every parameter and buffer of ``module`` by owner, name, identity and in-place version."""

    def __init__(self, module: torch.nn.Module):
        self.entries = [
            (owner, table, name, tensor, tensor._version)
            for owner in module.modules()
            for table in (owner._parameters, owner._buffers)
            for name, tensor in table.items()
            if tensor is not None
        ]

    def holds(self) -> bool:
        """True while no parameter or buffer was replaced or changed in place since capture."""
        for _owner, table, name, tensor, version in self.entries:
            if table.get(name) is not tensor or tensor._version != version:
                return False
        return True


def _caller() -> str:
    """Where in this package the refused operation was called (the last frame outside this file)."""
    for frame in reversed(traceback.extract_stack()):
        if "zeromismatch" in frame.filename and not frame.filename.endswith("step_graph.py"):
            return f"{frame.filename.rsplit('zeromismatch/', 1)[-1]}:{frame.lineno} in {frame.name}"
    return "outside zeromismatch"


class StepGraph:
    """A captured step: ``replay()`` reruns its records in order (module docstring)."""

    def __init__(self):
        self.records: list[tuple[Callable, tuple]] = []
        self.keep: list[torch.Tensor] = []
        self.refused: str | None = None
        self.replays = 0

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = f"{why} ({_caller()})"

    def replay(self) -> None:
        with torch.no_grad():  # as at capture; out= ops refuse inputs that require grad
            for call, args in self.records:
                call(*args)
        self.replays += 1

    @property
    def num_native_calls(self) -> int:
        return sum(call is _call_native for call, _ in self.records)

    def __len__(self) -> int:
        return len(self.records)


def _tracked_host_read(original, graph: StepGraph, what: str):
    def read(self, *args, **kwargs):
        if not reading_for_checks():
            graph.refuse(f"Tensor.{what}() at capture")
        return original(self, *args, **kwargs)

    return read


def capture(fn: Callable[[], object]) -> tuple[StepGraph, object]:
    """Run ``fn()`` once for real while recording it; returns the graph and ``fn``'s result.

    Recording only watches, so the result is ``fn``'s eager result even when the graph is refused:
    then ``graph.refused`` says why and the graph must not be replayed. Must run without autograd
    recording (``torch.no_grad``): a replay records no gradients."""
    if torch.is_grad_enabled():
        raise RuntimeError("step_graph.capture needs torch.no_grad(): a replay records no gradients")
    graph = StepGraph()
    library = _build.library()
    saved_library, saved_tolist, saved_numpy = _build.library, torch.Tensor.tolist, torch.Tensor.numpy
    recording = _RecordingLibrary(library, graph)
    _build.library = lambda *a, **k: recording if not (a or k) else saved_library(*a, **k)
    torch.Tensor.tolist = _tracked_host_read(saved_tolist, graph, "tolist")
    torch.Tensor.numpy = _tracked_host_read(saved_numpy, graph, "numpy")
    try:
        with _Recorder(graph):
            result = fn()
    finally:
        _build.library = saved_library
        torch.Tensor.tolist, torch.Tensor.numpy = saved_tolist, saved_numpy
    graph.keep.extend(_tensors(result))
    return graph, result
