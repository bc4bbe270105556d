"""Step-graph records that stand in for torch ops (``capture/record_replay.py``): plain data movement
and same-shape fp32 adds, which a decode step is full of, as native calls (``native/pointwise.c``:
``zm_copy_rows``, ``zm_copy_strided``, ``zm_add_f32``).

A copy moves bytes and an fp32 add with alpha 1 is one IEEE addition per element, so each record
gives the bits of the op it replaces, without ~5 us of torch dispatch a call; an add is also checked
once against the captured sum, as ``record_replay`` checks the ``out=`` overloads. Only simple cases
are taken -- strided CPU tensors, no aliasing between source and destination, int64 indices --
and everything else stays a torch op. An index that is outside its tensor at a replay makes
``zm_copy_rows`` return 1, which the graph reports as a diverged replay (where the torch op would
raise).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class NativeRecord(NamedTuple):
    """A native entry point, its arguments (raw addresses and sizes) and the status it returned."""

    name: str
    values: tuple
    status: int | None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.stride() != b.stride():
        return False
    if a.dtype is torch.bool or not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _rows_layout(t: torch.Tensor) -> bool:
    """Rows along dim 0, each one contiguous block (a contiguous tensor, or a slice of one's columns)."""
    return t.dim() >= 1 and t[0].is_contiguous()


def _strided_copy(dst: torch.Tensor, src: torch.Tensor) -> NativeRecord | None:
    """A record copying ``src`` into ``dst`` (same shape and dtype, up to 4 dims, any strides), or None."""
    if dst.shape != src.shape or dst.dtype != src.dtype or dst.dim() > 4 or dst.numel() == 0:
        return None
    if 0 in dst.stride() or not _disjoint(dst, src):  # (a destination element written twice; aliasing)
        return None
    pad = 4 - dst.dim()
    sizes = (1,) * pad + tuple(dst.shape)
    values = (
        dst.data_ptr(),
        src.data_ptr(),
        dst.element_size(),
        *sizes,
        *((0,) * pad + dst.stride()),
        *((0,) * pad + src.stride()),
    )
    return NativeRecord("zm_copy_strided", values, None)


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the two tensors' storages share no byte (two storages may view one buffer: found in
    review, two ``from_numpy`` views of one array)."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 + sa.nbytes() <= b0 or b0 + sb.nbytes() <= a0


def _plain(tensors) -> bool:
    """Every operand a strided CPU tensor whose bytes are its values, which the native calls read and
    write by address: a lazily negated or conjugated view holds the un-negated values, which a byte
    copy would move (found in review: a replayed clone of such a view lost its sign)."""
    return all(
        t.layout is torch.strided and t.device.type == "cpu" and not (t.is_neg() or t.is_conj())
        for t in tensors
    )


def lowered(library, func, args, kwargs, out) -> list[NativeRecord] | None:
    """Native records doing exactly what this aten call did, for the plain data movement and fp32 adds
    a decode step is full of (``zm_copy_rows``, ``zm_add_f32`` in native/pointwise.c), or None to
    replay the op itself. Copies move bytes and an fp32 add with alpha 1 is one IEEE addition per
    element, so the bits are the op's; only simple layouts (contiguous tensors, rows of contiguous
    blocks), no aliasing between source and destination, no lazily negated or conjugated views, and
    int64 indices are taken; an add is also checked once against the captured sum. A replayed index
    outside its tensor makes the native call return 1 (``ReplayDiverged``), as the torch op would
    raise; a negative one counts from the end for ``index`` (``t[idx]``), as in torch."""
    if library is None:
        return None
    name = str(func)
    operands = [out] if isinstance(out, torch.Tensor) else []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            operands.append(value)
        elif isinstance(value, list | tuple):
            operands.extend(v for v in value if isinstance(v, torch.Tensor))
    if not _plain(operands):
        return None
    try:
        if name == "aten.add.Tensor" and kwargs.get("alpha", 1) == 1:
            a, b, o = args[0], args[1], out
            tensors = (a, b, o)
            if not all(isinstance(t, torch.Tensor) and t.dtype is torch.float32 for t in tensors):
                return None
            if not all(t.is_contiguous() and t.shape == o.shape for t in tensors):
                return None
            if any(t.data_ptr() != o.data_ptr() and not _disjoint(t, o) for t in (a, b)):
                return None
            # checked once, as the out= overloads are (_functional_record): the sum gives torch's bytes
            probe = torch.empty_like(o)
            library.zm_add_f32(a.data_ptr(), b.data_ptr(), probe.data_ptr(), o.numel())
            if not same_bytes(probe, o):
                return None
            values = (a.data_ptr(), b.data_ptr(), o.data_ptr(), o.numel())
            return [NativeRecord("zm_add_f32", values, None)]
        if name == "aten.index_copy_.default":
            target, dim, index, source = args
            if dim not in (0, -target.dim()) or not (target.is_contiguous() and _rows_layout(source)):
                return None
            if index.dtype is not torch.int64 or index.dim() != 1 or not index.is_contiguous():
                return None
            if (
                source.dtype != target.dtype
                or source.shape[1:] != target.shape[1:]
                or not _disjoint(source, target)
            ):
                return None
            row = target[0].numel() * target.element_size()
            values = (
                target.data_ptr(),
                row,
                index.data_ptr(),
                target.shape[0],
                source.data_ptr(),
                source.stride(0) * source.element_size(),
                None,
                source.shape[0],
                index.numel(),
                row,
            )
            return [NativeRecord("zm_copy_rows", values, 0)]
        if name == "aten.index.Tensor":
            source, (index,) = args[0], args[1]
            if not isinstance(index, torch.Tensor) or index.dtype is not torch.int64 or index.dim() != 1:
                return None
            if not (source.is_contiguous() and out.is_contiguous() and index.is_contiguous()):
                return None
            if out.shape != (index.numel(), *source.shape[1:]) or out.dtype != source.dtype:
                return None
            row = source[0].numel() * source.element_size()
            values = (
                out.data_ptr(),
                row,
                None,
                out.shape[0],
                source.data_ptr(),
                row,
                index.data_ptr(),
                source.shape[0],
                index.numel(),
                row,
            )
            return [NativeRecord("zm_copy_rows", values, 0)]
        if name == "aten.clone.default":
            record = _strided_copy(out, args[0])
            return None if record is None else [record]
        if name == "aten.cat.default":
            parts, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim", 0))
            dim = dim % out.dim()
            records, offset = [], 0
            for part in parts:
                if part.numel() == 0:
                    continue
                if part.dim() != out.dim():
                    return None
                record = _strided_copy(out.narrow(dim, offset, part.shape[dim]), part)
                if record is None:
                    return None
                records.append(record)
                offset += part.shape[dim]
            return records if offset == out.shape[dim] else None
    except (TypeError, ValueError, IndexError, AttributeError, KeyError):
        return None
    return None
