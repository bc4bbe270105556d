"""Align the two recordings and find the first operator whose output differs.

Matching. A call is identified on both sides by its *site*: (module path, op, occurrence of
that op from that module within one forward), with ``paged_attention`` (engine) matched to
``attention`` (trainer) and ``quant_linear`` / ``row_parallel_linear`` to ``linear``
(``recorder.site_op``). A projection fused with its siblings on one side (one ``linear`` over
q/k/v or gate/up) and run one by one on the other is split into its column ranges
(``split_fused``). Within a site, output rows are matched by token identity
(sequence id, position). The trainer runs each site once over all tokens; the engine runs it
once per step over that step's tokens, so one trainer call gathers its rows from several
engine calls. If the engine computed a token twice (a preempted request), its last
computation is the one whose K/V / state flowed on, so the last one is kept.

Order. Sites are visited in the trainer's execution order (layer by layer, op by op within a
layer, then the head); the first site with any differing row is the first divergence.
Because a site only reads outputs of sites earlier in that order (attention and the Mamba2
scan read earlier positions of earlier sites or of themselves), its row inputs are normally
bitwise equal: the op itself is where the two backends part. ``inputs_identical`` checks
that claim for the row-aligned inputs (and, for row-wise ops, the weights).

Differ. Tensors of one dtype are compared bitwise: floating tensors as same-width integers, so
-0.0 differs from +0.0 and a NaN equals itself only with the same payload. Tensors of two
dtypes (a bf16 rollout against an fp32 trainer) differ by definition in their bits, so they
are compared by value instead (``rows_differ``: both in float64, a NaN equal to a NaN, -0.0
not equal to +0.0): the first diverging op is then the first whose values differ, and the
diff says by how much.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

import torch

from ..kernels.base import QuantizedWeight
from .recorder import ROW_ARGS, ROW_WISE_OPS, CallRecord, layer_of, row_outputs

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def row_bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: row i of a and b differ in any bit (or in dtype / trailing shape)."""
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"row_bits_differ needs the same number of rows, got {a.shape[0]} and {b.shape[0]}")
    if a.dtype != b.dtype or a.shape[1:] != b.shape[1:]:
        return torch.ones(a.shape[0], dtype=torch.bool)
    if a.is_floating_point():
        int_dtype = _INT_OF_SIZE[a.element_size()]
        a, b = a.contiguous().view(int_dtype), b.contiguous().view(int_dtype)
    differ = a != b
    return differ.reshape(a.shape[0], -1).any(dim=1) if a.dim() > 1 else differ


def rows_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: row i of a and b differ -- in bits for one dtype (``row_bits_differ``), in
    value for two (both in float64; NaN equals NaN, the sign of zero counts), always for another
    trailing shape."""
    if a.dtype == b.dtype or a.shape[0] != b.shape[0] or a.shape[1:] != b.shape[1:]:
        return row_bits_differ(a, b)
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    same = ((a64 == b64) & (torch.signbit(a64) == torch.signbit(b64))) | (a64.isnan() & b64.isnan())
    differ = ~same
    return differ.reshape(a.shape[0], -1).any(dim=1) if a.dim() > 1 else differ


def values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whole tensors: bitwise equal for one dtype, equal in value for two (``rows_differ``)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return not bool(rows_differ(a.reshape(1, -1), b.reshape(1, -1)).any())


def bits_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.numel() == 0:
            return True
        return not bool(row_bits_differ(a.reshape(1, -1), b.reshape(1, -1)).any())
    return a == b


def abs_rel_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Largest |a-b| and |a-b| / max(|a|, |b|) over elements whose bits differ (float64;
    an infinite or NaN difference reports inf)."""
    if a.shape != b.shape:
        return float("inf"), float("inf")
    if a.numel() == 0:
        return 0.0, 0.0
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    same = a64 == b64
    diff = torch.where(same, torch.zeros_like(a64), (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    scale = torch.maximum(a64.abs(), b64.abs())
    rel = torch.where(scale > 0, diff / scale, torch.where(diff > 0, float("inf"), 0.0))
    rel = torch.nan_to_num(rel, nan=float("inf"))
    return float(diff.max()), float(rel.max())


@dataclass
class SiteDiff:
    """The comparison of one site (one trainer call and the engine calls with its rows)."""

    site: str
    path: str
    op: str  # the trainer-side op
    engine_op: str | None
    layer: int | str
    occurrence: int
    trainer_call: int
    engine_calls: list[int]
    rows_compared: int
    rows_missing: int  # trainer rows the engine never computed at this site
    rows_differing: int
    first_row: tuple[int, int] | None  # (sequence id, position) of the first differing row
    max_abs_diff: float
    max_rel_diff: float
    trainer_shape: list[int]
    engine_shape: list[int] | None  # of the engine call holding first_row (or the first matched one)
    trainer_dtypes: list[str]
    engine_dtypes: list[str] | None
    # row inputs equal (bitwise, or in value across dtypes) and, for a row-wise op run the same way on
    # both sides, its other tensor arguments (weights) too
    inputs_identical: bool | None = None
    perturbed: bool = False
    first_engine_call: int | None = None  # engine call holding first_row
    first_engine_row: int | None = None
    first_trainer_row: int | None = None
    compared: str = "bits"  # "bits" (one dtype) | "values" (two dtypes: rows_differ)
    input_max_abs_diff: float | None = None  # over the row inputs of the differing rows
    weights_identical: bool | None = None  # None: not comparable (other ops, or no weights)
    trainer_weights: list[str] | None = None  # the other float / quantized arguments, described
    engine_weights: list[str] | None = None
    trainer_cols: list[int] | None = None  # [start, end): a projection's columns in a fused call's output
    engine_cols: list[int] | None = None
    engine_outside: str | None = None  # the engine call was made outside the KernelSet (OUTSIDE_OPS)

    @property
    def diverges(self) -> bool:
        return self.rows_differing > 0


@dataclass
class Comparison:
    sites: list[SiteDiff]
    first: SiteDiff | None
    trainer_only_sites: list[str] = field(default_factory=list)
    engine_only_sites: list[str] = field(default_factory=list)
    unaligned_trainer_calls: int = 0

    def to_dict(self) -> dict:
        return {
            "first": None if self.first is None else asdict(self.first),
            "sites": [asdict(s) for s in self.sites],
            "trainer_only_sites": self.trainer_only_sites,
            "engine_only_sites": self.engine_only_sites,
            "unaligned_trainer_calls": self.unaligned_trainer_calls,
        }


def _engine_index(records: list[CallRecord]) -> dict[tuple, dict[tuple[int, int], tuple[int, int]]]:
    """site key -> {(sequence, position): (position of the call in ``records``, row)}."""
    index: dict[tuple, dict[tuple[int, int], tuple[int, int]]] = {}
    for handle, record in enumerate(records):
        if record.row_keys is None:
            continue
        rows = index.setdefault(record.key, {})
        for row, (seq, pos) in enumerate(record.row_keys.tolist()):
            rows[(seq, pos)] = (handle, row)
    return index


def _dtypes(output) -> list[str]:
    items = output if isinstance(output, tuple) else (output,)
    return [str(t.dtype).removeprefix("torch.") for t in items if isinstance(t, torch.Tensor)]


def split_fused(records: list[CallRecord], other_keys: set) -> list[CallRecord]:
    """``records`` with each fused projection call (``CallRecord.parts``) that the other side has
    not made but whose projections it made one by one replaced by one record per projection: its
    columns of the output, its rows of the weight and bias, its own path and occurrence. A part
    keeps the fused call's ``index`` (what the repro reruns) and says its columns in ``cols``."""
    out = []
    for record in records:
        parts = record.parts
        if (
            not parts
            or record.key in other_keys
            or any((p, "linear", o) not in other_keys for p, _, _, o in parts)
        ):
            out.append(record)
            continue
        width = record.output.shape[-1]
        for path, start, end, occurrence in parts:
            args = dict(record.args)
            for name in ("weight", "bias"):
                if isinstance(args.get(name), torch.Tensor):
                    args[name] = args[name][start:end]
            perturbed = record.perturbed
            if perturbed is not None and not start <= perturbed["element"] % width < end:
                perturbed = None
            out.append(
                dataclasses.replace(
                    record, path=path, layer=layer_of(path), occurrence=occurrence, args=args,
                    output=record.output[..., start:end], perturbed=perturbed, parts=None, cols=(start, end),
                )
            )  # fmt: skip
    return out


def _describe(value) -> str | None:
    if isinstance(value, QuantizedWeight):
        layout = "" if value.block is None else f" {value.block[0]}x{value.block[1]}-block"
        return f"{value.format}{layout} {list(value.shape)}"
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    return None


def _weights(record: CallRecord) -> list[str]:
    """The call's floating / quantized arguments other than its row inputs (weights, caches)."""
    described = (
        (name, _describe(value)) for name, value in record.args.items() if name not in ROW_ARGS[record.op]
    )
    return [f"{name} {text}" for name, text in described if text is not None]


def _input_diff(trainer: CallRecord, engine: CallRecord, t_rows, e_rows) -> tuple[float, bool | None]:
    """(largest |difference| of the row inputs over these rows, whether the weights agree): the row
    inputs pair up by position (``x`` of linear is ``x_local`` of row_parallel_linear); the weights
    are compared only for a row-wise op the two sides call by the same name (None otherwise)."""
    worst = 0.0
    for t_name, e_name in zip(ROW_ARGS[trainer.op], ROW_ARGS[engine.op]):
        a, b = trainer.args.get(t_name), engine.args.get(e_name)
        if a is None and b is None:
            continue
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return float("inf"), None
        a, b = a[t_rows], b[e_rows]
        mask = rows_differ(a, b)
        if bool(mask.any()):
            worst = max(worst, abs_rel_diff(a[mask], b[mask])[0])
    if trainer.op not in ROW_WISE_OPS or trainer.op != engine.op:
        return worst, None
    weights = None
    for name, a in trainer.args.items():
        if name in ROW_ARGS[trainer.op]:
            continue
        b = engine.args.get(name)
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return worst, False
        if isinstance(a, torch.Tensor):
            weights = values_equal(a, b) and weights is not False
    return worst, weights


def compare_site(trainer: CallRecord, engine_rows: dict, engine_calls: list[CallRecord]) -> SiteDiff:
    """One trainer call against the engine calls holding its rows (``engine_rows``: what
    ``_engine_index`` gives for its key; handles index ``engine_calls``)."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    missing = 0
    keys = trainer.row_keys.tolist()
    for t_row, (seq, pos) in enumerate(keys):
        hit = engine_rows.get((seq, pos))
        if hit is None:
            missing += 1
            continue
        t_list, e_list = groups.setdefault(hit[0], ([], []))
        t_list.append(t_row)
        e_list.append(hit[1])
    t_outputs = row_outputs(trainer.op, trainer.output)
    differing_rows: list[tuple[int, int, int]] = []  # (trainer row, engine handle, engine row)
    max_abs = max_rel = 0.0
    input_abs = 0.0
    identical = True
    weights: bool | None = None
    perturbed = False
    compared = "bits"
    for handle, (t_list, e_list) in groups.items():
        engine = engine_calls[handle]
        perturbed = perturbed or engine.perturbed is not None
        t_rows, e_rows = torch.tensor(t_list), torch.tensor(e_list)
        differ = torch.zeros(len(t_list), dtype=torch.bool)
        for t_out, e_out in zip(t_outputs, row_outputs(engine.op, engine.output)):
            a, b = t_out[t_rows], e_out[e_rows]
            if a.dtype != b.dtype:
                compared = "values"
            mask = rows_differ(a, b)
            if bool(mask.any()):
                big_abs, big_rel = abs_rel_diff(a[mask], b[mask])
                max_abs, max_rel = max(max_abs, big_abs), max(max_rel, big_rel)
            differ |= mask
        if bool(differ.any()):
            for i in differ.nonzero()[:, 0].tolist():
                differing_rows.append((t_list[i], handle, e_list[i]))
            worst, same_weights = _input_diff(trainer, engine, t_rows[differ], e_rows[differ])
            input_abs = max(input_abs, worst)
            weights = same_weights if weights is None else weights and bool(same_weights)
            identical = identical and worst == 0 and same_weights is not False
    first = min(differing_rows) if differing_rows else None
    if first is not None:
        shape_call = engine_calls[first[1]]
    elif groups:
        shape_call = engine_calls[min(groups)]
    else:
        shape_call = None
    return SiteDiff(
        site=trainer.site,
        path=trainer.path,
        op=trainer.op,
        engine_op=None if shape_call is None else shape_call.op,
        layer=trainer.layer,
        occurrence=trainer.occurrence,
        trainer_call=trainer.index,
        engine_calls=sorted({engine_calls[h].index for h in groups}),
        rows_compared=sum(len(t) for t, _ in groups.values()),
        rows_missing=missing,
        rows_differing=len(differing_rows),
        first_row=None if first is None else tuple(keys[first[0]]),
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        trainer_shape=list(t_outputs[0].shape),
        engine_shape=None
        if shape_call is None
        else list(row_outputs(shape_call.op, shape_call.output)[0].shape),
        trainer_dtypes=_dtypes(trainer.output),
        engine_dtypes=None if shape_call is None else _dtypes(shape_call.output),
        inputs_identical=None if first is None else identical,
        perturbed=perturbed,
        first_engine_call=None if first is None else shape_call.index,
        first_engine_row=None if first is None else first[2],
        first_trainer_row=None if first is None else first[0],
        compared=compared,
        input_max_abs_diff=None if first is None else input_abs,
        weights_identical=None if first is None else weights,
        trainer_weights=None if first is None else _weights(trainer),
        engine_weights=None if first is None else _weights(shape_call),
        trainer_cols=None if trainer.cols is None else list(trainer.cols),
        engine_cols=None if shape_call is None or shape_call.cols is None else list(shape_call.cols),
        engine_outside=None if shape_call is None else shape_call.outside,
    )


def compare_records(engine_records: list[CallRecord], trainer_records: list[CallRecord]) -> Comparison:
    """Visit the trainer's calls in execution order; the first with a differing row is the
    first divergence."""
    engine_keys = {r.key for r in engine_records if r.row_keys is not None}
    trainer_keys = {r.key for r in trainer_records if r.row_keys is not None}
    engine_records = split_fused(engine_records, trainer_keys)
    trainer_records = split_fused(trainer_records, engine_keys)
    engine_index = _engine_index(engine_records)
    sites: list[SiteDiff] = []
    trainer_only: list[str] = []
    unaligned = 0
    seen = set()
    for trainer in trainer_records:
        if trainer.row_keys is None:
            unaligned += 1
            continue
        seen.add(trainer.key)
        rows = engine_index.get(trainer.key)
        if rows is None:
            trainer_only.append(trainer.site)
            continue
        sites.append(compare_site(trainer, rows, engine_records))
    engine_only = sorted({r.site for r in engine_records if r.row_keys is not None and r.key not in seen})
    first = next((s for s in sites if s.diverges), None)
    return Comparison(sites, first, trainer_only, engine_only, unaligned)
