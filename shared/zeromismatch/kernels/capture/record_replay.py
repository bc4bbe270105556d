"""Step graphs: one decode step's forward recorded once and replayed, the CPU counterpart of the
CUDA graphs vLLM replays for its decode batches.

Why: a tiny model's decode step spends more time in Python (module calls, argument checks, views,
the ~23 native calls' wrappers) than in its kernels (benchmarks/rollout_breakdown.py). Replaying a
recorded list of the step's data-writing operations skips all of that.

Capture runs ``fn()`` for real (its result is this step's result) while recording, in order:
- every call into the native library (``kernels/native/_build.py``'s entry points), with its exact
  arguments (raw addresses) and its return status;
- every aten op below autograd (a ``TorchDispatchMode``): ops that write data are kept -- in-place
  and ``out=`` ops as they were called, functional ops through their ``out=`` overload writing the
  tensor the capture produced (checked once to give the captured bytes) or as a call and a copy
  into it, so later records, which hold that tensor, read the new values; views and ``empty``
  allocations write nothing and are dropped.
Replay runs the records in order. Each op is the same function on the same shapes and the same
memory, so a replay gives the bits the eager forward gives for the same inputs (tests compare them
with ``torch.equal``, and the engine's parity chain runs with graphs on). Plain data movement and
same-shape fp32 adds are recorded as native calls instead (``ops_as_native_calls.py``: row copies through an
index, strided copies, ``zm_add_f32``): a copy moves bytes and an fp32 add is one IEEE addition per
element, so the bits are the op's without ~5 us of torch dispatch each; a replayed index outside
its tensor makes such a call return 1, which diverges the replay (below).

Memory. The graph holds every tensor the capture touched, every value the packed-weight cache
handed out during it (``weight_cache.py``: weight panels, rope tables, dequantized weights, which
native calls read by address), and the tensors the caller names in ``held`` (weights and inputs
that reach native calls without an aten op). At the end of a capture every pointer argument of
every native call must lie inside one of them, else the capture is refused: nothing a replay
reads or writes can have been freed and reused. (Found in review: the packed panels were read by
address without being held, and a cleared or evicting cache freed them under the graph.)

What cannot be recorded refuses the capture (``graph.refused`` says why and where; the caller runs
eagerly): reading tensor data on the host (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``,
``.numpy()``, creating a tensor from Python values), because a value read at capture would be
replayed as a constant; random ops; ops whose output shape depends on data. Kernel code that reads
data only to *check* it (and raise) marks the read with ``host_reads_for_checks()``; a replay skips
those checks, so its caller must hand it inputs that passed them at capture's shapes (the engine
builds them itself). ``host_reads_of_graph_constants()`` marks reads of values the caller's key
fixes. A native call whose status at replay differs from capture's (e.g. zm_rope past its table, or
a bad block id) raises ``ReplayDiverged``: the caller reruns the step eagerly, which raises the
proper error or takes the fallback the eager path takes. A capture that had to build packed
weights says so (``cache_builds``): its records rebuild them at every replay.

Staleness. Graphs are bound to shapes, dtypes, thread count and the memory of their inputs: the
caller keys them on those and copies new inputs into the captured input tensors before
``replay()``. They read weights by address: ``Guard`` snapshots what the eager kernels' caches
re-check on every call -- each parameter, buffer, tensor attribute and quantized weight by owner
and name, in-place version, address, shape, stride and dtype, holding the storages so no new one
can take an old address, plus the packed-weight cache's generation (``clear_packed_weights``) --
and a graph whose guard fails must be dropped.

Capture patches ``_build.library`` and ``torch.Tensor.tolist``/``numpy`` process-wide for its
duration; only the capturing thread's calls are recorded or checked, and ``torch._dynamo`` (which
the dispatch mode imports, and which keeps references to Tensor's methods) is imported first.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import os
import threading
import traceback
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..base import QuantizedWeight
from ..native import _build
from ..weight_cache import packed_weights
from .allowed_host_reads import host_reads_for_checks, reading_for_checks
from .ops_as_native_calls import NativeRecord, lowered, same_bytes

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
        if func in _ALLOCATIONS:
            graph.note_private(outputs)
        if reading_for_checks() or func in _ALLOCATIONS:
            return
        unusual = [t.layout for t in inputs + outputs if t.layout is not torch.strided]
        if unusual:  # (an MKL-DNN tensor has no storage whose address a record could hold)
            graph.refuse(f"{func} on a {unusual[0]} tensor")
            return
        if func._schema.is_mutable:
            native = lowered(graph.library, func, args, kwargs, None)
            graph.records.extend(
                _records(graph, native) if native is not None else [(_call_op, (func, args, kwargs))]
            )
            return
        input_storages = {_storage_key(t) for t in inputs}
        if outputs and all(_storage_key(t) in input_storages for t in outputs):
            return  # a view: its storage already holds whatever the records write
        if not outputs:
            # (an op of no tensor, such as promote_types, cannot read one)
            if inputs and not isinstance(out, torch.dtype | torch.Size | type(None)):
                graph.refuse(f"{func} returned a {type(out).__name__} to Python at capture")
            return
        native = lowered(graph.library, func, args, kwargs, out) if isinstance(out, torch.Tensor) else None
        graph.records.extend(
            _records(graph, native) if native is not None else [_functional_record(func, args, kwargs, out)]
        )
        graph.note_private(outputs)


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
            if out_func is not None and same_bytes(probe, out):
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
            # (another thread's calls go through unrecorded: the patch is process-wide)
            if getattr(_active, "graph", None) is graph and not reading_for_checks():
                graph.records.append((_call_native, (function, args, status, name)))
            return status

        return record


def _records(graph: StepGraph, native: list[NativeRecord]) -> list[tuple]:
    """``ops_as_native_calls``'s records as the graph's native-call records."""
    return [(_call_native, (getattr(graph.library, r.name), r.values, r.status, r.name)) for r in native]


def _call_native(function, args, status, name) -> None:
    got = function(*args)
    if got != status:
        raise ReplayDiverged(f"native {name} returned {got!r} at replay, {status!r} at capture")


class Guard:
    """What a step graph read by address and the eager kernels re-check on every call: each
    parameter, buffer, plain tensor attribute and quantized weight of ``module`` (by owner and
    name, identity, in-place version, address, storage, shape, stride and dtype), and the
    packed-weight cache's generation (``clear_packed_weights``: writes that bypass the version
    counter). ``holds()`` is False once any of them changed."""

    def __init__(self, module: torch.nn.Module):
        self.generation = packed_weights().generation
        self.owners = []  # (attribute dict, name, value): replacement
        self.tensors = []  # (tensor, its state): in-place and storage changes
        for owner in module.modules():
            attributes = vars(owner)
            for table in (owner._parameters, owner._buffers, attributes):
                for name, value in table.items():
                    if table is attributes and name in _MODULE_TABLES:
                        continue  # (the tables themselves: each tensor is guarded once)
                    tensors = _guarded_tensors(value)
                    if tensors:
                        self.owners.append((table, name, value))
                        self.tensors.extend((t, _tensor_state(t)) for t in tensors)
        # the storages as they are now, kept alive: a tensor given new storage (``w.data = ...``)
        # cannot get the old address back, so its address tells the change
        self.storages = [t.untyped_storage() for t, _ in self.tensors]

    def held(self) -> list[torch.Tensor]:
        return [tensor for tensor, _state in self.tensors]

    def holds(self) -> bool:
        if packed_weights().generation != self.generation:
            return False
        for table, name, value in self.owners:
            if table.get(name) is not value:
                return False
        for tensor, state in self.tensors:
            if _tensor_state(tensor) != state:
                return False
        return True


#: the module's own tables in ``vars(module)``: their tensors are guarded through the tables
_MODULE_TABLES = ("_parameters", "_buffers", "_modules")


def _tensor_state(t: torch.Tensor) -> tuple:
    # (not the storage: a new storage has a new address while the guard holds the old one)
    return (t._version, t.data_ptr(), t.shape, t.stride(), t.dtype)


def _guarded_tensors(value) -> list[torch.Tensor]:
    """The tensors a module attribute holds: itself, a QuantizedWeight's, or those of a dict or list
    of them (MoE experts' quantized weights)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, QuantizedWeight):
        return [t for t in (value.data, value.scales, value.global_scale) if t is not None]
    if isinstance(value, dict | list | tuple):
        items = value.values() if isinstance(value, dict) else value
        return [t for item in items for t in _guarded_tensors(item)]
    return []


_THIS_FILE = os.path.basename(__file__)


def _caller() -> str:
    """Where in this package the refused operation was called (the last frame outside this file)."""
    for frame in reversed(traceback.extract_stack()):
        if "zeromismatch" in frame.filename and not frame.filename.endswith(_THIS_FILE):
            return f"{frame.filename.rsplit('zeromismatch/', 1)[-1]}:{frame.lineno} in {frame.name}"
    return "outside zeromismatch"


class StepGraph:
    """A captured step: ``replay()`` reruns its records in order (module docstring)."""

    def __init__(self):
        self.records: list[tuple[Callable, tuple]] = []
        #: every tensor (and packed-weight value) the capture touched: records hold their addresses
        self.keep: list[object] = []
        self.refused: str | None = None
        #: packed weights built during the capture (a cache miss): its records rebuild them at every
        #: replay, so the caller should capture again once the cache is warm
        self.cache_builds = 0
        self.private_bytes = 0  # bytes of the tensors the capture allocated (the graph's own memory)
        self._private: set[int] = set()
        self.replays = 0
        self.thread = threading.get_ident()
        #: the native library, for the records that stand in for torch ops (``ops_as_native_calls``)
        self.library = None

    def note_private(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._private:
                self._private.add(storage.data_ptr())
                self.private_bytes += storage.nbytes()

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

    def native_call_names(self) -> list[str]:
        """The native entry point of each native record, in order (tests, diagnostics)."""
        return [args[3] for call, args in self.records if call is _call_native]

    def __len__(self) -> int:
        return len(self.records)


#: the graph this thread is capturing (the patched host reads and the native proxy look it up, so
#: nothing they are bound to holds a graph after its capture)
_active = threading.local()


def _tracked_host_read(original, what: str):
    def read(self, *args, **kwargs):
        graph = getattr(_active, "graph", None)
        if graph is not None and not reading_for_checks():
            graph.refuse(f"Tensor.{what}() at capture")
        return original(self, *args, **kwargs)

    return read


def _uncovered_pointer(graph: StepGraph) -> str | None:
    """The first native call argument pointing outside every tensor the graph keeps, if any: a
    replay would read or write memory that may be freed and reused (checked once, at capture)."""
    spans = {}
    for t in _tensors(graph.keep):
        storage = t.untyped_storage()
        spans[storage.data_ptr()] = max(spans.get(storage.data_ptr(), 0), storage.nbytes())
    starts = sorted(spans)
    for call, args in graph.records:
        if call is not _call_native:
            continue
        _function, values, _status, name = args
        signature = _build.SIGNATURES[name][0]
        for kind, value in zip(signature, values):
            if kind != "p" or not value:
                continue
            i = bisect.bisect_right(starts, value) - 1
            if i < 0 or value > starts[i] + spans[starts[i]]:
                return f"native {name} reads address {value:#x}, which no tensor the capture kept holds"
    return None


def capture(fn: Callable[[], object], held: Iterable[torch.Tensor] = ()) -> tuple[StepGraph, object]:
    """Run ``fn()`` once for real while recording it; returns the graph and ``fn``'s result.

    Recording only watches, so the result is ``fn``'s eager result even when the graph is refused:
    then ``graph.refused`` says why and the graph must not be replayed. Must run without autograd
    recording (``torch.no_grad``): a replay records no gradients. ``held``: tensors the caller keeps
    alive and watches itself (a model's weights under a ``Guard``), which native calls may read
    without passing them through an aten op; the graph holds them too. A native call that points
    outside every tensor the graph holds refuses the capture."""
    if torch.is_grad_enabled():
        raise RuntimeError("capture() needs torch.no_grad(): a replay records no gradients")
    # entering a TorchDispatchMode imports torch._dynamo (~1 s, once), which snapshots Tensor's
    # methods: import it before they are patched, or it keeps the patched ones (found in review)
    importlib.import_module("torch._dynamo")

    graph = StepGraph()
    graph.keep.extend(held)
    library = _build.library()
    graph.library = library
    saved_library, saved_tolist, saved_numpy = _build.library, torch.Tensor.tolist, torch.Tensor.numpy
    recording = _RecordingLibrary(library, graph)
    cache = packed_weights()

    def watch(value, built: bool) -> None:
        if getattr(_active, "graph", None) is graph:
            graph.keep.append(value)  # native calls read packed values by address
            graph.cache_builds += built

    _build.library = lambda *a, **k: recording if not (a or k) else saved_library(*a, **k)
    torch.Tensor.tolist = _tracked_host_read(saved_tolist, "tolist")
    torch.Tensor.numpy = _tracked_host_read(saved_numpy, "numpy")
    cache.watchers.append(watch)
    _active.graph = graph
    try:
        with _Recorder(graph):
            result = fn()
    finally:
        _active.graph = None
        cache.watchers.remove(watch)
        _build.library = saved_library
        torch.Tensor.tolist, torch.Tensor.numpy = saved_tolist, saved_numpy
    graph.keep.extend(_tensors(result))
    if graph.refused is None:
        uncovered = _uncovered_pointer(graph)
        if uncovered is not None:
            graph.refused = uncovered
    return graph, result
