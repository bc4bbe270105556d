"""Write a standalone minimal repro of the first divergence.

The repro is the one op call on each side that produced the first differing row: the
engine's call (e.g. one decode step's rows and its paged cache) and the trainer's call (the
packed batch). Their arguments go to ``rollout_inputs.safetensors`` /
``trainer_inputs.safetensors`` (tensors) and ``repro.json`` (everything else), the recorded
output rows to ``expected.safetensors``, and ``repro.py`` -- which imports only torch,
safetensors and ``zeromismatch.kernels`` -- runs the op of a kernel set on both inputs and
checks the aligned rows (exit status 1 when they differ): bit for bit when both sides give one
dtype, by value otherwise, printing the dtypes and the size of the difference.

Each side's call runs in that side's numerics: its recorded inputs keep their dtype, weight format
and (engine) cache contents, and a call the engine made outside the KernelSet (its
activation-dtype lm_head, ``recorder.OUTSIDE_OPS``) runs as the engine computed it. A
projection the trainer fused with its siblings is rerun whole and compared on its columns.

Minimizing. For row-wise ops (a row's output depends only on that row's inputs: linear,
norms, activations, rope, lm_head, the logprob ops, MoE routing/experts) the calls are
shrunk while they still reproduce under the recorded kernel sets: the engine call to the
single differing row, then the trainer call to the smallest window of rows ending at that
row among 1, 2, 4, 8, ... rows. Attention, conv and scan calls are kept whole (their rows
read other rows).

A divergence planted by ``--perturb`` is not in any kernel; its repro passes with every
kernel set, and repro.json records ``"injected": true``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..kernels import QuantizedWeight, get_kernels
from .compare import rows_differ
from .recorder import OUTSIDE_OPS, ROW_ARGS, ROW_WISE_OPS, CallRecord, row_outputs

SIDES = ("rollout", "trainer")


def _encode_args(args: dict, tensors: dict[str, torch.Tensor]) -> dict:
    spec = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            key = f"arg.{name}"
            tensors[key] = value.detach().clone().contiguous()
            spec[name] = {"kind": "tensor", "key": key}
        elif isinstance(value, QuantizedWeight):
            fields = {}
            for part in ("data", "scales", "global_scale"):
                tensor = getattr(value, part)
                if tensor is not None:
                    fields[part] = f"arg.{name}.{part}"
                    tensors[fields[part]] = tensor.detach().clone().contiguous()
            spec[name] = {
                "kind": "quantized_weight",
                "format": value.format,
                "shape": list(value.shape),
                "block": None if value.block is None else list(value.block),
                "tensors": fields,
            }
        elif isinstance(value, tuple):
            spec[name] = {"kind": "tuple", "value": list(value)}
        elif value is None or isinstance(value, (bool, int, float, str)):
            spec[name] = {"kind": "value", "value": value}
        elif name == "group":
            spec[name] = {"kind": "value", "value": None}  # the repro runs at TP degree 1
        else:
            raise TypeError(f"bisect repro: cannot save argument {name!r} of type {type(value).__name__}")
    return spec


def _slice_rows(op: str, args: dict, rows: torch.Tensor) -> dict:
    out = dict(args)
    for name in ROW_ARGS[op]:
        if isinstance(out.get(name), torch.Tensor):
            out[name] = out[name][rows]
    return out


def _columns(outputs: list[torch.Tensor], cols) -> list[torch.Tensor]:
    return outputs if cols is None else [out[..., cols[0] : cols[1]] for out in outputs]


def _run(record: CallRecord, kernels, args: dict, cols=None) -> list[torch.Tensor]:
    # on copies: an engine call may update a store in place (the per-slot Mamba2 states), and the
    # recorded arguments must stay what the call saw -- for the next run and for the saved repro
    fresh = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with torch.no_grad():
        if record.outside is not None:
            output = OUTSIDE_OPS[record.outside][1](**fresh)
        else:
            output = getattr(get_kernels(kernels), record.op)(**fresh)
    return _columns(row_outputs(record.op, output), cols)


def _rows_differ(a: list[torch.Tensor], b: list[torch.Tensor], a_rows, b_rows) -> bool:
    return any(bool(rows_differ(x[a_rows], y[b_rows]).any()) for x, y in zip(a, b))


def minimize(
    engine: CallRecord, trainer: CallRecord, e_row: int, t_row: int, e_kernels, t_kernels,
    e_cols=None, t_cols=None,
):  # fmt: skip
    """Smallest calls (as described in the module docstring) that still differ under the
    recorded kernels and still compute the diverging row's bits: a kernel whose result depends on
    the rows beside it (a batch-wide activation scale, a GEMM that picks its algorithm by M) would
    otherwise have its call shrunk into a different computation, dropping the very cause of the
    divergence. ``e_cols`` / ``t_cols``: the columns compared of a fused call's output.
    Returns (engine args, engine rows, trainer args, trainer rows, info)."""
    e_args, t_args = dict(engine.args), dict(trainer.args)
    e_rows, t_rows = [e_row], [t_row]
    info = {"reproduces": False, "rollout_minimized": False, "trainer_minimized": False}
    e_out = _run(engine, e_kernels, e_args, e_cols)
    t_out = _run(trainer, t_kernels, t_args, t_cols)
    if not _rows_differ(e_out, t_out, e_rows, t_rows):
        return e_args, e_rows, t_args, t_rows, info
    info["reproduces"] = True
    if engine.op not in ROW_WISE_OPS or trainer.op not in ROW_WISE_OPS:
        return e_args, e_rows, t_args, t_rows, info
    one = _slice_rows(engine.op, e_args, torch.tensor([e_row]))
    one_out = _run(engine, e_kernels, one, e_cols)
    if not _rows_differ(one_out, e_out, [0], [e_row]) and _rows_differ(one_out, t_out, [0], t_rows):
        e_args, e_rows, e_out = one, [0], one_out
        info["rollout_minimized"] = True
    total = row_outputs(trainer.op, trainer.output)[0].shape[0]
    size = 1
    while size < total:
        start = max(0, t_row - size + 1)
        window = _slice_rows(trainer.op, t_args, torch.arange(start, t_row + 1))
        window_out = _run(trainer, t_kernels, window, t_cols)
        same = not _rows_differ(window_out, t_out, [t_row - start], [t_row])
        if same and _rows_differ(e_out, window_out, e_rows, [t_row - start]):
            t_args, t_rows = window, [t_row - start]
            info["trainer_minimized"] = True
            break
        size *= 2
    return e_args, e_rows, t_args, t_rows, info


def numerics_differ(cfg) -> bool:
    """Whether the two sides compute in different numerics beyond their kernel sets (dtype, weight
    format, the engine's KV cache or head): then no single kernel set makes them agree."""
    rollout, trainer = cfg.numerics("rollout"), cfg.numerics("trainer")
    return (
        (rollout["dtype"], rollout["quant"]) != (trainer["dtype"], trainer["quant"])
        or rollout["kv_cache_dtype"] != "auto"
        or rollout["lm_head"] != "fp32"
    )


def write_repro(result, out_dir: str | Path) -> dict:
    """Write the repro of ``result.first`` into ``out_dir``; returns what repro.json holds."""
    from safetensors.torch import save

    from ..io import atomic_write_bytes, atomic_write_text

    first = result.first
    if first is None:
        raise ValueError("no divergence to reproduce: every compared op output is bitwise identical")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine = result.rollout.records[first.first_engine_call]
    trainer = result.trainer.records[first.trainer_call]
    cfg = result.config
    injected = bool(first.perturbed)
    cols = {"rollout": first.engine_cols, "trainer": first.trainer_cols}
    e_args, e_rows, t_args, t_rows, info = minimize(
        engine,
        trainer,
        first.first_engine_row,
        first.first_trainer_row,
        cfg.rollout_kernels,
        cfg.trainer_kernels,
        cols["rollout"],
        cols["trainer"],
    )
    if not injected and not info["reproduces"]:
        info["note"] = "re-running the recorded calls did not reproduce the difference"
    spec_args = {}
    for side, args in (("rollout", e_args), ("trainer", t_args)):
        tensors: dict[str, torch.Tensor] = {}
        spec_args[side] = _encode_args(args, tensors)
        atomic_write_bytes(out / f"{side}_inputs.safetensors", save(tensors))
    expected = {}
    for k, (a, b) in enumerate(
        zip(
            _columns(row_outputs(engine.op, engine.output), cols["rollout"]),
            _columns(row_outputs(trainer.op, trainer.output), cols["trainer"]),
        )
    ):
        expected[f"rollout.{k}"] = a[[first.first_engine_row]].contiguous()
        expected[f"trainer.{k}"] = b[[first.first_trainer_row]].contiguous()
    atomic_write_bytes(out / "expected.safetensors", save(expected))
    spec = {
        "model": cfg.model,
        "site": first.site,
        "layer": first.layer,
        "token": list(first.first_row),
        "op": {"rollout": engine.op, "trainer": trainer.op},
        "args": spec_args,
        "rows": {"rollout": e_rows, "trainer": t_rows},
        "cols": cols,
        "outside": {"rollout": engine.outside, "trainer": trainer.outside},
        "numerics": {side: cfg.numerics(side) for side in SIDES},
        "numerics_differ": numerics_differ(cfg),
        "recorded_kernels": {"rollout": cfg.rollout_label, "trainer": cfg.trainer_label},
        "injected": injected,
        "minimize": info,
        "bisect_command": command_line(cfg),
        "bisect_settings_without_flag": unexpressible_settings(cfg),
    }
    atomic_write_text(out / "repro.json", json.dumps(spec, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "repro.py", REPRO_SCRIPT)
    atomic_write_text(out / "README.md", _readme(spec))
    return spec


_CLI_REQUIRED = ("model", "rollout_kernels", "trainer_kernels", "seed")


def _non_default_settings(cfg) -> dict:
    import dataclasses

    from .driver import BisectConfig

    return {
        field.name: getattr(cfg, field.name)
        for field in dataclasses.fields(BisectConfig)
        if field.name not in _CLI_REQUIRED and getattr(cfg, field.name) != field.default
    }


#: the flags' (and BisectConfig's default) spelling of a dtype given by its torch name
_SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}
#: settings whose flag spells None as ``none`` (``--prefill-chunk none``: whole prompts per step)
_NONE_SPELLED = {"prefill_chunk"}


def unexpressible_settings(cfg) -> list[str]:
    """Non-default settings no ``zm bisect`` flag can give (a None other than ``--prefill-chunk
    none``); repro.json and the README name them next to the command."""
    return [
        f"{name}=None"
        for name, value in _non_default_settings(cfg).items()
        if value is None and name not in _NONE_SPELLED
    ]


def command_line(cfg) -> str:
    """The ``zm bisect`` command that reruns this bisection: the required flags, the seed, and
    every other setting that differs from its ``BisectConfig`` default (each field's flag is its
    name with dashes; None spelled ``none`` where the flag takes it), except those of
    :func:`unexpressible_settings`."""
    import shlex

    parts = ["zm bisect", f"--model {shlex.quote(cfg.model)}"]
    parts.append(f"--rollout-kernels {shlex.quote(cfg.rollout_label)}")
    parts.append(f"--trainer-kernels {shlex.quote(cfg.trainer_label)}")
    parts.append(f"--seed {cfg.seed}")
    for name, value in _non_default_settings(cfg).items():
        value = _SHORT_DTYPE.get(value, value) if name in ("dtype", "rollout_dtype") else value
        if value is None and name in _NONE_SPELLED:
            parts.append(f"--{name.replace('_', '-')} none")
        elif value is not None:
            parts.append(f"--{name.replace('_', '-')} {shlex.quote(str(value))}")
    return " ".join(parts)


def _readme(spec: dict) -> str:
    ops = spec["op"]
    recorded = ", ".join(f"{side}={name}" for side, name in spec["recorded_kernels"].items())
    note = (
        "\nThis divergence was planted by `--perturb`; no kernel causes it, so the repro passes "
        "with every kernel set.\n"
        if spec["injected"]
        else ""
    )
    if spec["bisect_settings_without_flag"]:
        without_flag = ", ".join(spec["bisect_settings_without_flag"])
        note += f"\nThe bisection also set {without_flag}, which no flag gives.\n"
    from .report import describe_numerics

    numerics = "\n".join(f"- {side}: {describe_numerics(n)}" for side, n in spec["numerics"].items())
    if spec["numerics_differ"]:
        head = spec["outside"]["rollout"] is not None
        how = (
            "The two sides compute in different numerics, and each call reruns in its own: its inputs "
            "keep their dtype, weight format and cache contents"
            + (", and the engine's head runs as the engine ran it (outside the KernelSet)" if head else "")
            + ". `--kernels NAME` runs one kernel set on both sides' inputs"
            + (" (the engine's head then through that set's lm_head)" if head else "")
            + "; a difference that comes from the dtype, the format or the cache stays."
        )
    else:
        how = "Both sides compute in the same numerics: only the kernel sets differ."
    return f"""# Minimal repro: {ops["trainer"]} at layer {spec["layer"]} ({spec["site"]})

Written by `{spec["bisect_command"]} --out <dir>`. The rollout engine's `{ops["rollout"]}` call
and the trainer's `{ops["trainer"]}` call produced different outputs for the token
(sequence {spec["token"][0]}, position {spec["token"][1]}).
{note}
{numerics}

{how}

    python repro.py                     # as recorded: {recorded}
    python repro.py --kernels default   # one kernel set on both sides
    python repro.py --kernels aligned

Exit status 0: the aligned rows agree (bitwise; in value where the two sides' dtypes differ);
1: they differ, with the dtypes and the size of the difference printed. Files:
`rollout_inputs.safetensors`, `trainer_inputs.safetensors` (tensor arguments),
`repro.json` (other arguments, the rows and columns to compare), `expected.safetensors` (the rows
as recorded during the bisection).
"""


REPRO_SCRIPT = '''#!/usr/bin/env python
"""Minimal repro written by `zm bisect`: one op, the rollout-side and the trainer-side call.

Runs the op on the saved rollout inputs and on the saved trainer inputs, each in its side's
numerics (its inputs' dtypes and weight format; a kernel set, or the engine's own computation for
a call it made outside the KernelSet), and checks that the rows of the same token agree: bit for
bit when both sides give one dtype (floats compared as integers of the same width), by value
otherwise. Exit status 0: they agree; 1: they differ. See README.md and repro.json.
"""

import argparse
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file

from zeromismatch.kernels import QuantizedWeight, available_kernels, get_kernels

HERE = pathlib.Path(__file__).resolve().parent
INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# computations the engine makes outside the KernelSet (zeromismatch.bisect.recorder.OUTSIDE_OPS)
OUTSIDE = {
    # engine/runner.py ModelRunner.compute_logits with lm_head_precision="activation"
    "activation-lm-head": lambda hidden, weight: (
        torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()
    ),
}


def load_args(spec, side):
    tensors = load_file(str(HERE / f"{side}_inputs.safetensors"))
    args = {}
    for name, entry in spec["args"][side].items():
        if entry["kind"] == "tensor":
            args[name] = tensors[entry["key"]]
        elif entry["kind"] == "tuple":
            args[name] = tuple(entry["value"])
        elif entry["kind"] == "quantized_weight":
            parts = {k: tensors[v] for k, v in entry["tensors"].items()}
            block = None if entry["block"] is None else tuple(entry["block"])
            args[name] = QuantizedWeight(
                entry["format"], parts["data"], parts["scales"], tuple(entry["shape"]), block,
                parts.get("global_scale"),
            )
        else:
            args[name] = entry["value"]
    return args


def row_outputs(op, output):
    if isinstance(output, tuple):
        return [output[i] for i in {"moe_route": (0, 1)}.get(op, (0,))]
    return [output]


def bits(t):
    return t.contiguous().view(INTS[t.element_size()]) if t.is_floating_point() else t


def agree(a, b):
    """Elementwise: bitwise for one dtype; by value (float64, NaN = NaN, the sign of zero counts) for two."""
    if a.dtype == b.dtype:
        return bits(a) == bits(b)
    a64, b64 = a.double(), b.double()
    return ((a64 == b64) & (torch.signbit(a64) == torch.signbit(b64))) | (a64.isnan() & b64.isnan())


def describe(a, b, same):
    a64, b64 = a.double(), b.double()
    delta = torch.nan_to_num((a64 - b64).abs(), nan=float("inf"))
    scale = torch.maximum(a64.abs(), b64.abs())
    rel = torch.where(scale > 0, delta / scale, torch.zeros_like(delta))
    first = int((~same).reshape(-1).nonzero()[0, 0])
    return (f"{int((~same).sum())} of {same.numel()} elements, max abs diff {float(delta.max()):.3g}, "
            f"max rel diff {float(rel.max()):.3g}; first at element {first}: rollout "
            f"{float(a.reshape(-1)[first])!r} vs trainer {float(b.reshape(-1)[first])!r}")


def main():
    spec = json.loads((HERE / "repro.json").read_text())
    outside, cols = spec.get("outside", {}), spec.get("cols", {})
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernels", help="one kernel set for both sides: " + ", ".join(available_kernels()))
    parser.add_argument("--rollout-kernels", help="default: as recorded")
    parser.add_argument("--trainer-kernels", help="default: as recorded")
    args = parser.parse_args()
    chosen = {
        "rollout": args.kernels or args.rollout_kernels,
        "trainer": args.kernels or args.trainer_kernels,
    }
    kernels = {side: chosen[side] or spec["recorded_kernels"][side] for side in chosen}
    # a call made outside the KernelSet runs as the engine made it unless a kernel set is chosen for its side
    runs_outside = {side: None if chosen[side] else outside.get(side) for side in chosen}
    try:
        sets = {side: get_kernels(name) for side, name in kernels.items() if not runs_outside[side]}
    except ValueError as err:  # e.g. the bisection ran a KernelSet object that is not registered
        print(f"repro.py: {err}; choose one with --kernels / --rollout-kernels / --trainer-kernels")
        return 2
    outputs, hows = {}, {}
    with torch.no_grad():
        for side in ("rollout", "trainer"):
            op = spec["op"][side]
            call_args = load_args(spec, side)
            shapes = ", ".join(
                f"{k} {list(v.shape)} {str(v.dtype).replace('torch.', '')}"
                for k, v in call_args.items()
                if isinstance(v, torch.Tensor)
            )
            outside_name = runs_outside[side]
            hows[side] = f"outside the KernelSet: {outside_name}" if outside_name else kernels[side]
            print(f"{side:8s} {op}({shapes})  [{hows[side]}]")
            if runs_outside[side]:
                result = OUTSIDE[runs_outside[side]](**call_args)
            else:
                result = getattr(sets[side], op)(**call_args)
            rows = torch.tensor(spec["rows"][side])
            outputs[side] = [out[rows] for out in row_outputs(op, result)]
            if cols.get(side):
                start, end = cols[side]
                outputs[side] = [out[..., start:end] for out in outputs[side]]
                print(f"{'':8s} compared on columns [{start}, {end}): one projection of a fused call")
    print(f"{spec['op']['rollout']} [{hows['rollout']}] vs {spec['op']['trainer']} [{hows['trainer']}]"
          f" at {spec['site']}, token (sequence, position) = {tuple(spec['token'])}")
    expected = load_file(str(HERE / "expected.safetensors"))
    for side in outputs:
        # a shrunken call is another call: only a call kept whole and run as recorded must give the
        # recorded bits
        as_recorded = bool(runs_outside[side]) or (
            not outside.get(side) and kernels[side] == spec["recorded_kernels"][side]
        )
        if as_recorded and not spec["minimize"][f"{side}_minimized"]:
            same = all(
                torch.equal(bits(out), bits(expected[f"{side}.{k}"])) for k, out in enumerate(outputs[side])
            )
            print(f"{side} call reproduces the row recorded during the bisection: {same}")
    equal, one_dtype = True, True
    for k, (a, b) in enumerate(zip(outputs["rollout"], outputs["trainer"])):
        one_dtype = one_dtype and a.dtype == b.dtype
        line = (f"output {k}: rollout {list(a.shape)} {str(a.dtype).replace('torch.', '')} vs trainer "
                f"{list(b.shape)} {str(b.dtype).replace('torch.', '')}: ")
        if a.shape != b.shape:
            equal = False
            print(line + "DIFFERENT (shapes)")
            continue
        same = agree(a, b)
        if bool(same.all()):
            print(line + ("bitwise identical" if a.dtype == b.dtype else "equal in value"))
            continue
        equal = False
        print(line + f"DIFFERENT {'bitwise' if a.dtype == b.dtype else 'in value'}: {describe(a, b, same)}")
    if not equal:
        print("FAIL: the two sides differ")
        return 1
    print("PASS: bitwise identical" if one_dtype else "PASS: equal in value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
