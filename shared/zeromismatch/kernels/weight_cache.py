"""The packed-weight cache: values derived from weights (oneDNN-packed panels, concatenated q/k/v,
dequantized weights, rope tables), built once and reused while the weights are unchanged.

Speed only: a cached value is exactly what a rebuild would give, so the bits of every op that reads
one are the bits it would compute without the cache. The GEMMs (``aligned/gemm.py``), the models'
fused projections, the quantized weights and the native kernels all read through it; step graphs
(``kernels/step_graph.py``) watch its lookups and hold what a capture read.

Staleness: an entry is keyed by the weight's root tensor (a view such as ``w_up[e]`` or
``w[:, piece]`` is keyed by its base plus its offset/shape/strides), its data pointer and the
in-place version counter shared by a tensor and its views; ``copy_``, ``add_`` and every
autograd-visible in-place write bump that counter, and an entry dies with its root tensor
(weak reference), as it does with its storage (so reassigning ``w.data``, as ``Module.to`` does, is
seen). Writes that bypass the counter -- through ``.data``, a numpy view, or
``torch.optim`` with ``fused=True`` (measured: no bump) -- are NOT seen: call
``clear_packed_weights()`` after them. Not cached: inference tensors (no version counter), lazily
negated or conjugated views (same storage, pointer and version as the plain tensor),
weights that need a gradient in the current grad mode (a trainer's step changes them
anyway), and everything once the byte budget (``ZEROMISMATCH_PACKED_WEIGHTS_MB``, default
2048; ``0`` disables) is full (least recently used entries go first).
"""

from __future__ import annotations

import math
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch


class PackedWeights:
    """LRU map (tag, weights' roots and view geometry) -> packed value; see the module docstring."""

    def __init__(self, budget_bytes: int, budget_error: str = ""):
        self.budget_bytes = budget_bytes  # < 0: ``budget_error`` (a bad environment variable) on lookup
        self.budget_error = budget_error or f"packed-weight budget must be >= 0 bytes, got {budget_bytes}"
        # key -> (weakrefs to roots, versions, nbytes, value), least recently used first
        self.entries: OrderedDict[tuple, tuple] = OrderedDict()
        self.nbytes = 0
        #: (id(weight), tag) -> (weakref, version, pointer, shape, stride, dtype, storage weakref,
        #: value): lookup_one's front, emptied by every change to ``entries`` except an insertion
        self.front: dict[tuple, tuple] = {}
        #: bumped by ``clear()``: a step graph (kernels/step_graph.py) holding packed values drops them
        self.generation = 0
        #: called with (value, built) on every lookup that returns a value; a step-graph capture
        #: keeps what its native calls read, and retakes a capture that had to build something
        self.watchers: list[Callable[[object, bool], None]] = []

    def _notify(self, value, built: bool):
        for watcher in self.watchers:
            watcher(value, built)
        return value

    def _invalidate_front(self) -> None:
        self.front.clear()

    def lookup(self, weights: tuple[torch.Tensor, ...], tag: tuple, build: Callable[[], tuple[object, int]]):
        """The cached ``build()[0]`` for these weights (in their current versions), building it
        on a miss; None when one of them may not be cached (see the module docstring)."""
        if self.budget_bytes <= 0:
            if self.budget_bytes < 0:
                raise ValueError(self.budget_error)
            return None
        grad = torch.is_grad_enabled()
        roots, key, versions = [], [tag], []
        # written for speed (a decode step looks up ~10 weights; each attribute read costs ~0.1 us)
        for weight in weights:
            # a lazily negated/conjugated view shares storage, pointer and version with the plain
            # tensor, so no key could tell them apart
            lazy_view = weight.is_neg() or weight.is_conj()
            if lazy_view or weight.is_inference() or (grad and weight.requires_grad):
                return None
            root = weight._base
            if root is None:
                root = weight
            # the storage too: ``w.data = other`` (as ``Module.to`` does) keeps the object and its
            # version, and may even reuse the old address
            roots += (root, weight.untyped_storage())
            key.append((id(root), weight.data_ptr(), weight.shape, weight.stride(), weight.dtype))
            versions.append(weight._version)
        key, versions = tuple(key), tuple(versions)
        hit = self.entries.get(key)
        if hit is not None:
            alive = hit[1] == versions
            for ref, root in zip(hit[0], roots):
                alive = alive and ref() is root
            if alive:
                self.entries.move_to_end(key)  # most recently used goes last
                return self._notify(hit[3], False) if self.watchers else hit[3]
            del self.entries[key]
            self.nbytes -= hit[2]
            self._invalidate_front()
        with torch.no_grad():
            value, nbytes = build()
        if self.watchers:
            self._notify(value, True)
        if nbytes > self.budget_bytes // 4:  # one huge weight would evict everything else
            return value
        while self.entries and self.nbytes + nbytes > self.budget_bytes:
            _, oldest = self.entries.popitem(last=False)
            self.nbytes -= oldest[2]
            self._invalidate_front()
        entries = self.entries
        # an entry dies with any of its roots or storages
        refs = tuple(weakref.ref(root, lambda _, key=key: self._drop(key, entries)) for root in roots)
        entries[key] = (refs, versions, nbytes, value)
        self.nbytes += nbytes
        return value

    def lookup_one(self, weight: torch.Tensor, tag: tuple, build: Callable[[], tuple[object, int]]):
        """``lookup((weight,), tag, build)`` -- the same entries and rules -- for the one-weight
        calls of a decode step, through a front map keyed by the weight object: a hit reads what
        places the values (storage, pointer, shape, stride, dtype) and the version, and skips the
        key's hashing and the LRU update (~0.9 us of a ~3 us one-row GEMM instead of ~2). Front
        entries die with any removal from the main map; a front hit does not
        refresh the entry's LRU position, so a busy weight may be evicted first (then rebuilt)."""
        front = self.front.get((id(weight), tag))
        if (
            front is not None
            and front[0]() is weight
            and weight._version == front[1]
            and weight.data_ptr() == front[2]
            and weight.shape == front[3]
            and weight.stride() == front[4]
            and weight.dtype is front[5]
            and front[6]() is weight.untyped_storage()
            and not weight.is_neg()
            and not (weight.requires_grad and torch.is_grad_enabled())
            and self.budget_bytes > 0
        ):
            return self._notify(front[7], False) if self.watchers else front[7]
        value = self.lookup((weight,), tag, build)
        if value is None:
            return None
        root = weight._base
        if root is None:
            root = weight
        key = (tag, (id(root), weight.data_ptr(), weight.shape, weight.stride(), weight.dtype))
        held = self.entries.get(key)
        if held is not None and held[3] is value:  # not a value too large to keep (built, not cached)
            front_key, front = (id(weight), tag), self.front

            def forget(ref, front_key=front_key, front=front) -> None:
                # a short-lived view's entry goes with it (else they pile up until the next removal)
                entry = front.get(front_key)
                if entry is not None and entry[0] is ref:
                    del front[front_key]

            self.front[front_key] = (
                weakref.ref(weight, forget), weight._version, weight.data_ptr(), weight.shape,
                weight.stride(), weight.dtype, weakref.ref(weight.untyped_storage()), value,
            )  # fmt: skip
        return value

    def _drop(self, key, entries) -> None:
        entry = entries.pop(key, None)
        if entry is not None and entries is self.entries:
            self.nbytes -= entry[2]
            self._invalidate_front()

    def clear(self) -> None:
        # empty the old dict too: its weak-reference callbacks hold it in a reference cycle, which
        # would keep the cleared values alive (and reachable) until the garbage collector runs
        old, self.entries = self.entries, OrderedDict()
        self.nbytes = 0
        self.generation += 1
        self._invalidate_front()
        old.clear()


BUDGET_ENV = "ZEROMISMATCH_PACKED_WEIGHTS_MB"  # (the budget, in MiB; 0 disables the cache)


def _budget_from_env() -> int:
    raw = os.environ.get(BUDGET_ENV, "2048").strip() or "2048"
    try:
        mib = float(raw)
    except ValueError:
        mib = math.nan
    if not mib >= 0 or math.isinf(mib):  # nan fails the comparison; int(inf * 2**20) would overflow
        raise ValueError(f"{BUDGET_ENV} must be a number of MiB >= 0 (0 disables the cache), got {raw!r}")
    return int(mib * 2**20)


#: as for the tile rows, a bad value is raised by the first lookup, not at import: the budget is
#: then -1, which ``lookup`` (the one place that reads it on a miss) turns into the ValueError
try:
    _PACKED = PackedWeights(_budget_from_env())
except ValueError as err:
    _PACKED = PackedWeights(-1, budget_error=str(err))
#: ``cached_from_weights((weight,), tag, build)`` by the cache's cheaper one-weight lookup (bound
#: once: a module-level wrapper costs a frame per decode-step GEMM)
cached_from_weight = _PACKED.lookup_one


def packed_weights() -> PackedWeights:
    """The process's packed-weight cache (step graphs watch its lookups and its generation)."""
    return _PACKED


def clear_packed_weights() -> None:
    """Forget every packed weight (needed only after writes that bypass the version counter)."""
    _PACKED.clear()


def cached_from_weights(
    weights: tuple[torch.Tensor, ...], tag: tuple, build: Callable[[], tuple[object, int]]
):
    """Any value derived from ``weights`` (``build() -> (value, nbytes)``, run under no_grad),
    held in the packed-weight cache under its staleness rules and byte budget (e.g. the models'
    concatenated q/k/v weight); None when the weights may not be cached."""
    return _PACKED.lookup(weights, tag, build)
