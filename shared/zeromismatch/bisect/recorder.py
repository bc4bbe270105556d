"""``RecordingKernels``: a KernelSet that runs another one and records every call.

Each call becomes a ``CallRecord``: the op name, the module path of the model module that
made it (``model.layers.3.mlp.gate``), the decoder-layer index parsed from that path, the
call's occurrence number among calls of the same op from the same module within one
forward "group", its bound arguments and its output, and the token identity of every
output row (``row_keys [T, 2]`` = sequence id, absolute position).

Attribution needs no model change: forward pre/post hooks on every submodule keep a stack
of module paths, and ``attach`` wraps the instance's ``forward`` so each model forward
starts a new group (occurrence counters restart) and activates the row keys the driver
announced for it with ``expect_rows``. Calls made after the forward returns (the lm_head,
the logprob ops of the sampler or the trainer) use the announced *head* row keys. A call
whose leading dim does not match the active keys is recorded with ``row_keys=None`` and is
not compared.

One logical op can have several entry points, and the two sides need not take the same one:
the engine's ``paged_attention`` is the trainer's ``attention``, and a projection runs as
``linear``, ``row_parallel_linear`` (a dense row-parallel layer) or ``quant_linear`` (quantized
weights) depending on the side's weight format. ``site_op`` names the op a call is matched by.
A side with dense weights also fuses sibling projections (q/k/v, gate/up) into one ``linear``
from their parent module, which a quantized side runs one by one; such a call is recorded once,
with ``parts`` naming the column range of each projection, so the comparison can split it.

``record_outside`` records a call made outside the KernelSet (the engine's activation-dtype
lm_head, ``engine/runner.py::ModelRunner.compute_logits``), named in ``OUTSIDE_OPS``.

Arguments are stored by name (``inspect.signature`` of the KernelSet method); tensors that
are not ``nn.Parameter`` are cloned at call time, because the engine mutates some of them
later (the paged K/V cache). Parameters are kept by reference: weights do not change during
a bisection. Outputs are cloned too, after an optional ``Perturbation`` (one ulp, toward
+inf, on one element of one call) so the tool can be shown to find a planted divergence.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..kernels.base import KernelSet

#: every op of the KernelSet contract, in a stable order
KERNEL_OPS: tuple[str, ...] = tuple(sorted(KernelSet.__abstractmethods__))

#: engine-side op name -> the trainer-side op it must match (one logical op, two entry points)
CANONICAL_OP = {"paged_attention": "attention"}
#: the op a call is matched by across sides: ``CANONICAL_OP`` plus the projection entry points,
#: which a side's weight format chooses (a module calls exactly one of them)
SITE_OP = {**CANONICAL_OP, "quant_linear": "linear", "row_parallel_linear": "linear"}


def _activation_lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # engine/runner.py ModelRunner.compute_logits with lm_head_precision="activation"
    return torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()


#: computations made outside the KernelSet that are recorded (``record_outside``): name -> (op it
#: stands for, the function, called with the recorded arguments)
OUTSIDE_OPS = {"activation-lm-head": ("lm_head", _activation_lm_head)}

#: arguments whose leading dim is the token dim (rows line up with the output rows)
ROW_ARGS: dict[str, tuple[str, ...]] = {
    "linear": ("x",),
    "row_parallel_linear": ("x_local",),
    "quant_linear": ("x",),
    "rms_norm": ("x",),
    "gated_rms_norm": ("x", "gate"),
    "rope": ("x", "positions"),
    "silu_mul": ("gate", "up"),
    "relu2": ("x",),
    "attention": ("q",),
    "paged_attention": ("q",),
    "lm_head": ("hidden",),
    "log_softmax": ("logits",),
    "processed_log_softmax": ("logits", "temperature", "top_k", "top_p"),
    "moe_route": ("router_logits",),
    "moe_experts": ("x", "topk_weights", "topk_ids"),
    "causal_conv1d": ("x",),
    "ssm_scan": ("x", "dt", "B", "C"),
}

#: which elements of a tuple output are token-aligned (the rest is per-sequence state)
ROW_OUTPUTS: dict[str, tuple[int, ...]] = {
    "moe_route": (0, 1),
    "causal_conv1d": (0,),
    "ssm_scan": (0,),
}

#: ops whose output row depends only on the same row of the row args: a repro may slice rows
ROW_WISE_OPS = frozenset(
    {
        "linear",
        "row_parallel_linear",
        "quant_linear",
        "rms_norm",
        "gated_rms_norm",
        "rope",
        "silu_mul",
        "relu2",
        "lm_head",
        "log_softmax",
        "processed_log_softmax",
        "moe_route",
        "moe_experts",
    }
)

HEAD = "head"
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_SIGNATURES = {op: inspect.signature(getattr(KernelSet, op)) for op in KERNEL_OPS}
if set(ROW_ARGS) != set(KERNEL_OPS):  # a new op in the contract needs its row args declared here
    raise RuntimeError(f"bisect.recorder.ROW_ARGS is out of date: {sorted(set(KERNEL_OPS) ^ set(ROW_ARGS))}")


def canonical_op(op: str) -> str:
    return CANONICAL_OP.get(op, op)


def site_op(op: str) -> str:
    return SITE_OP.get(op, op)


def layer_of(path: str) -> int | str:
    """Decoder-layer index from a module path; ``"head"`` for anything outside the layers
    (embedding, final norm, lm_head and the logprob ops)."""
    match = _LAYER_RE.search(path)
    return int(match.group(1)) if match else HEAD


def row_outputs(op: str, output) -> list[torch.Tensor]:
    """The token-aligned tensors of an op's output, in a fixed order."""
    if isinstance(output, tuple):
        return [output[i] for i in ROW_OUTPUTS.get(op, (0,))]
    return [output]


@dataclass
class Perturbation:
    """Add one ulp (``torch.nextafter`` toward +inf) to one element of the output of the
    first call of ``op`` at ``layer`` (an int, ``"head"``, or None = the first layer where
    the op is called). ``paged_attention`` and ``attention`` name the same op."""

    op: str
    layer: int | str | None = None
    applied_to: dict | None = None  # filled when applied: call index, path, element

    @staticmethod
    def parse(spec: str) -> Perturbation:
        """``OP@LAYER`` (``linear@1``, ``rms_norm@head``) or just ``OP``."""
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"--perturb needs OP@LAYER, got {spec!r}")
        op, _, layer = spec.strip().partition("@")
        op = op.strip()
        if op not in KERNEL_OPS:
            raise ValueError(f"--perturb: unknown op {op!r}; ops: {', '.join(KERNEL_OPS)}")
        if not layer:
            return Perturbation(op, None)
        layer = layer.strip()
        if layer == HEAD:
            return Perturbation(op, HEAD)
        if not layer.isdigit():
            raise ValueError(f"--perturb: layer must be a non-negative int or 'head', got {layer!r}")
        return Perturbation(op, int(layer))

    def matches(self, op: str, layer: int | str) -> bool:
        if self.applied_to is not None or canonical_op(op) != canonical_op(self.op):
            return False
        return self.layer is None or self.layer == layer

    def apply(self, op: str, output):
        """Returns the output with one element moved one ulp up (the first finite element of
        the first token-aligned floating tensor)."""
        outputs = list(output) if isinstance(output, tuple) else [output]
        for index in ROW_OUTPUTS.get(op, (0,)) if isinstance(output, tuple) else (0,):
            tensor = outputs[index]
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            flat = tensor.detach().reshape(-1)
            finite = torch.isfinite(flat).nonzero()
            if finite.numel() == 0:
                continue
            element = int(finite[0, 0])
            bumped = flat.clone()
            bumped[element] = torch.nextafter(flat[element], torch.tensor(float("inf"), dtype=flat.dtype))
            outputs[index] = bumped.view(tensor.shape)
            per_row = max(1, tensor.numel() // max(1, tensor.shape[0])) if tensor.dim() else 1
            self.applied_to = {
                "output_index": index,
                "element": element,
                "row": element // per_row,
                "before": float(flat[element]),
                "after": float(bumped[element]),
            }
            return tuple(outputs) if isinstance(output, tuple) else outputs[0]
        raise ValueError(f"--perturb: the output of {op} has no finite floating element to perturb")


@dataclass
class CallRecord:
    index: int  # position in this recorder's call sequence
    op: str
    path: str  # module path of the caller ("" outside any module: lm_head / logprob ops)
    layer: int | str
    occurrence: int  # n-th call of this op from this module within the group
    group: int  # model forward this call belongs to (head calls join the preceding forward)
    args: dict[str, Any]
    output: Any
    row_keys: torch.Tensor | None  # [T, 2] int64 (sequence id, position) or None
    perturbed: dict | None = None
    # a fused projection: (module path, first column, end column, occurrence) of each projection
    parts: list[tuple[str, int, int, int]] | None = None
    # one projection of a fused call (``compare.split_fused``): its output columns in the call's output
    cols: tuple[int, int] | None = None
    outside: str | None = None  # an ``OUTSIDE_OPS`` name: the call was not made through the KernelSet

    @property
    def key(self) -> tuple[str, str, int]:
        """What identifies "the same call" on the engine and the trainer side."""
        return (self.path, site_op(self.op), self.occurrence)

    @property
    def site(self) -> str:
        return f"{self.path or '(head)'}:{canonical_op(self.op)}#{self.occurrence}"


def _snapshot(value):
    if isinstance(value, nn.Parameter):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_snapshot(v) for v in value)
    return value


@dataclass
class _RowPlan:
    forward: torch.Tensor | None = None
    head: torch.Tensor | None = None


class _RecorderState:
    def __init__(self, perturbation: Perturbation | None):
        self.records: list[CallRecord] = []
        self.stack: list[str] = []
        self.group = -1
        self.occurrences: dict[tuple[str, str], int] = {}
        self.pending = _RowPlan()
        self.active: torch.Tensor | None = None
        self.perturbation = perturbation
        self.modules: dict[str, nn.Module] = {}


class _RecordingBase(KernelSet):
    """A KernelSet that delegates every op to ``inner`` and records the call (see the module
    docstring). ``RecordingKernels`` is this class plus one forwarding method per op."""

    def __init__(self, inner: KernelSet | str, perturb: Perturbation | str | None = None):
        from ..kernels import get_kernels

        self.inner = get_kernels(inner)
        if isinstance(perturb, str):
            perturb = Perturbation.parse(perturb)
        self.name = f"recording({self.inner.name})"
        self._state = _RecorderState(perturb)

    def __getattr__(self, attr):
        # extras a kernel set may carry beyond the contract (flags, helpers) come from inner
        if attr.startswith("_") or attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    # ---- what the driver uses ------------------------------------------------
    @property
    def records(self) -> list[CallRecord]:
        return self._state.records

    @property
    def perturbation(self) -> Perturbation | None:
        return self._state.perturbation

    def expect_rows(self, forward: torch.Tensor | None, head: torch.Tensor | None) -> None:
        """Row keys ``[T, 2]`` (sequence id, position) for the next model forward and for the
        head calls that follow it."""
        self._state.pending = _RowPlan(_as_keys(forward, "forward"), _as_keys(head, "head"))

    def clear(self) -> None:
        modules = self._state.modules  # an attached model stays attached
        self._state = _RecorderState(self._state.perturbation)
        self._state.modules = modules

    @contextlib.contextmanager
    def attach(self, model: nn.Module):
        """Route ``model``'s kernel calls through this recorder, with module-path hooks, for
        the duration of the ``with`` block; restores the model's kernel set afterwards."""
        state = self._state
        previous = model.kernels
        handles = []
        state.modules = dict(model.named_modules())
        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(_push(state, name)))
            handles.append(module.register_forward_hook(_pop(state)))
        original_forward = model.forward

        def recorded_forward(*args, **kwargs):
            state.stack.clear()
            state.group += 1
            state.occurrences.clear()
            plan, state.pending = state.pending, _RowPlan()
            state.active = plan.forward
            try:
                return original_forward(*args, **kwargs)
            finally:
                state.stack.clear()
                state.active = plan.head

        model.forward = recorded_forward
        model.set_kernels(self)
        try:
            yield self
        finally:
            del model.forward  # the instance attribute; the class method shows through again
            model.set_kernels(previous)
            for handle in handles:
                handle.remove()

    # ---- the recording itself ------------------------------------------------
    def _record(self, op: str, args: tuple, kwargs: dict):
        bound = _SIGNATURES[op].bind(self, *args, **kwargs)
        bound.apply_defaults()
        # before the call: a kernel that writes into its input must not have its output recorded as
        # its input (the report would then blame an upstream difference, and the repro rerun it twice)
        named = {k: _snapshot(v) for k, v in bound.arguments.items() if k != "self"}
        output = getattr(self.inner, op)(*args, **kwargs)
        return self._append(op, named, output)

    def record_outside(self, outside: str, args: dict, output):
        """Record a computation the caller made outside the KernelSet (an ``OUTSIDE_OPS`` name, its
        arguments by name, its output) as a call of the op it stands for; returns the output (with
        the perturbation applied, when it matches)."""
        op, _ = OUTSIDE_OPS[outside]
        return self._append(op, {k: _snapshot(v) for k, v in args.items()}, output, outside)

    def _append(self, op: str, named: dict, output, outside: str | None = None):
        state = self._state
        path = state.stack[-1] if state.stack else ""
        layer = layer_of(path)
        slot = (path, site_op(op))
        occurrence = state.occurrences.get(slot, 0)
        state.occurrences[slot] = occurrence + 1
        perturbed = None
        if state.perturbation is not None and state.perturbation.matches(op, layer):
            output = state.perturbation.apply(op, output)
            perturbed = dict(state.perturbation.applied_to, call_index=len(state.records), path=path)
            state.perturbation.applied_to = perturbed
        rows = state.active
        lead = row_outputs(op, output)[0]
        if rows is not None and (lead.dim() == 0 or lead.shape[0] != rows.shape[0]):
            rows = None
        state.records.append(
            CallRecord(
                index=len(state.records),
                op=op,
                path=path,
                layer=layer,
                occurrence=occurrence,
                group=max(state.group, 0),
                args=named,
                output=_snapshot(output),
                row_keys=rows,
                perturbed=perturbed,
                parts=_fused_parts(state, path, named.get("weight")) if op == "linear" else None,
                outside=outside,
            )
        )
        return output


def _fused_parts(state: _RecorderState, path: str, weight) -> list[tuple[str, int, int, int]] | None:
    """The projections a ``linear`` call from a non-``Linear`` module fuses: the run of its
    ``Linear`` children whose weights, concatenated, are the call's weight (``models/layers.py::
    fused_linear``). Each projection takes the next occurrence of its own path, as its separate
    call on the other side does."""
    from ..models.layers import Linear

    module = state.modules.get(path)
    if module is None or isinstance(module, Linear) or not isinstance(weight, torch.Tensor):
        return None
    children = [(n, c) for n, c in module.named_children() if isinstance(c, Linear) and c.weight is not None]
    for start in range(len(children)):
        run, rows = [], 0
        for name, child in children[start:]:
            if rows >= weight.shape[0]:
                break
            run.append((name, child))
            rows += child.weight.shape[0]
        if len(run) < 2 or rows != weight.shape[0]:
            continue
        stacked = torch.cat([child.weight.detach() for _, child in run])
        if stacked.shape != weight.shape or stacked.dtype != weight.dtype or not torch.equal(stacked, weight):
            continue
        parts, column = [], 0
        for name, child in run:
            child_path = f"{path}.{name}" if path else name
            slot = (child_path, "linear")
            occurrence = state.occurrences.get(slot, 0)
            state.occurrences[slot] = occurrence + 1
            parts.append((child_path, column, column + child.weight.shape[0], occurrence))
            column += child.weight.shape[0]
        return parts
    return None


def _as_keys(keys, what: str) -> torch.Tensor | None:
    if keys is None:
        return None
    keys = torch.as_tensor(keys, dtype=torch.int64)
    if keys.dim() != 2 or keys.shape[1] != 2:
        raise ValueError(
            f"expect_rows({what}=...) needs [T, 2] (sequence id, position), got {tuple(keys.shape)}"
        )
    return keys


def _push(state: _RecorderState, name: str):
    def hook(module, args):
        state.stack.append(name)

    return hook


def _pop(state: _RecorderState):
    def hook(module, args, output):
        if state.stack:
            state.stack.pop()

    return hook


def _forwarder(op: str):
    def method(self, *args, **kwargs):
        return self._record(op, args, kwargs)

    method.__name__ = op
    method.__qualname__ = f"RecordingKernels.{op}"
    method.__doc__ = getattr(KernelSet, op).__doc__
    return method


#: ``RecordingKernels(inner, perturb=None)``: every KernelSet op forwards to ``inner`` and is recorded
RecordingKernels = type(
    "RecordingKernels",
    (_RecordingBase,),
    {"__module__": __name__, "__doc__": _RecordingBase.__doc__, **{op: _forwarder(op) for op in KERNEL_OPS}},
)
