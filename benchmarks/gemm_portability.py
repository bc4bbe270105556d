"""Which GEMM calls give a row the same bits whatever the batch? A probe for a new CPU or GPU.

The aligned set's GEMMs rest on measured facts about one library build (kernels/aligned/gemm.py).
This probe re-measures them on whatever machine it runs on, for fp32 and bf16 and five
tiny-model weight shapes, and writes which calls broke:

- ``rows``: a row's output in calls of M rows (M = 1..33, 40, ..., 512) and at row offsets 1, 3, 7
  inside a 100-row call, against the same row in one 512-row call; for the aligned ``linear``
  with a prepacked and with an unpacked weight (padded oneDNN on the CPU, padded ``F.linear``
  elsewhere), raw oneDNN with the plain weight (CPU only) and plain ``F.linear`` (MKL on the
  CPU, cuBLAS on a GPU);
- ``tiles``: the same with *every* library call exactly T rows (``--tiles``, default 16, 32; the batch is cut
  into T-row tiles, the last zero-padded), at 1, 4 and 16 torch threads on the CPU, plus whether
  the thread count changes a tile's bits. Fixed shapes are what batch-invariant GPU kernels use;
  this asks whether the stock libraries give the same guarantee when only the shape is fixed.

Each entry lists the row counts (``bad_M``) and offsets (``bad_offsets``) whose rows differed
(empty = invariant on this machine). A report, not a test. Usage:
``python benchmarks/gemm_portability.py --device cpu --mode rows --out rows.json [--quiet]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from zeromismatch.argtypes import check_out_or_exit, device_or_exit
from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.aligned import gemm

ROW_COUNTS = [*range(1, 34), 40, 47, 48, 63, 64, 65, 100, 128, 200, 257, 512]
TILE_ROW_COUNTS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 47, 64, 100, 257]
SHAPES = [(256, 256), (1024, 1024), (1024, 3072), (256, 4096), (768, 64)]  # (K, N)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return gemm._LINEAR(x, weight, None, "none", [None], "")


def _inputs(k: int, n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(k + n)
    x = torch.randn(512, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype).to(device)
    return x, w


def _breaks(fn: Callable, x: torch.Tensor, row_counts: list[int]) -> dict:
    reference = fn(x)
    bad_m = [m for m in row_counts if not torch.equal(fn(x[:m]), reference[:m])]
    bad_offsets = [o for o in (1, 3, 7) if not torch.equal(fn(x[o : o + 100]), reference[o : o + 100])]
    return {"bad_M": bad_m, "bad_offsets": bad_offsets}


def probe_rows(device: torch.device, progress) -> dict:
    aligned = get_kernels("aligned")
    out = {}
    for (dname, dtype), (k, n) in progress([(d, s) for d in DTYPES.items() for s in SHAPES]):
        x, w = _inputs(k, n, dtype, device)
        with torch.inference_mode():
            w_inference = w.clone()  # an inference tensor is never prepacked: the plain-weight path
        calls = {
            "aligned_linear": lambda a, w=w: aligned.linear(a, w),
            "aligned_linear_unpacked": lambda a, w=w_inference: aligned.linear(a, w),
            "F.linear": lambda a, w=w: F.linear(a, w),
        }
        if device.type == "cpu":
            calls["onednn_plain"] = lambda a, w=w: _onednn(a, w)
        for name, fn in calls.items():
            out[f"{dname} K={k} N={n} {name}"] = _breaks(fn, x, ROW_COUNTS)
    return out


def _tiled(fn: Callable, x: torch.Tensor, tile: int) -> torch.Tensor:
    rows = x.shape[0]
    pad = -rows % tile
    padded = torch.cat([x, x.new_zeros(pad, x.shape[1])]) if pad else x
    return torch.cat([fn(padded[i : i + tile].contiguous()) for i in range(0, rows + pad, tile)])[:rows]


def probe_tiles(device: torch.device, progress, tiles: tuple[int, ...] = (16, 32)) -> dict:
    threads = [1, 4, 16] if device.type == "cpu" else [torch.get_num_threads()]
    saved = torch.get_num_threads()
    out = {}
    try:
        for (dname, dtype), (k, n) in progress([(d, s) for d in DTYPES.items() for s in SHAPES]):
            x, w = _inputs(k, n, dtype, device)
            if device.type == "cpu":
                packed = gemm._pack(w, 1)[0]
                calls = {
                    "onednn_plain": lambda a, w=w: _onednn(a, w),
                    "onednn_packed": lambda a, p=packed: _onednn(a, p),
                    "F.linear": lambda a, w=w: F.linear(a, w),
                }
            else:
                calls = {"F.linear": lambda a, w=w: F.linear(a, w)}
            for name, fn in calls.items():
                for tile in tiles:
                    outputs = {}
                    for t in threads:
                        torch.set_num_threads(t)

                        def tiled(a, fn=fn, tile=tile):
                            return _tiled(fn, a, tile)

                        outputs[t] = tiled(x)
                        out[f"{dname} K={k} N={n} {name} T={tile} threads={t}"] = _breaks(
                            tiled, x, TILE_ROW_COUNTS
                        )
                    out[f"{dname} K={k} N={n} {name} T={tile} threads_differing_from_{threads[0]}"] = [
                        t for t in threads if not torch.equal(outputs[t], outputs[threads[0]])
                    ]
    finally:
        torch.set_num_threads(saved)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", choices=("rows", "tiles"), default="rows")
    parser.add_argument("--out", default="", help="write the findings as JSON (with provenance) here")
    parser.add_argument("--tiles", default="16,32", help="tiles mode: comma-separated rows per call")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        tiles = tuple(int(t) for t in args.tiles.split(","))
    except ValueError:
        parser.error(f"--tiles must be comma-separated integers, got {args.tiles!r}")
    if any(t < 1 for t in tiles):
        parser.error(f"--tiles must be positive, got {args.tiles!r}")
    check_out_or_exit(parser, args.out)  # before any measuring
    device = device_or_exit(parser, args.device)

    def progress(items):
        return tqdm(items, disable=args.quiet, desc=args.mode)

    with torch.no_grad():  # not inference mode: the aligned linear may prepack these weights
        if args.mode == "rows":
            findings = probe_rows(device, progress)
        else:
            findings = probe_tiles(device, progress, tiles)
    broken = {
        key: value
        for key, value in findings.items()
        if value and (not isinstance(value, dict) or any(value.values()))
    }
    for key, value in broken.items():
        print(f"{key}: {value}")
    print(f"{len(broken)} of {len(findings)} entries broke invariance on {device}")
    if args.out:
        from zeromismatch._provenance import provenance
        from zeromismatch.io import atomic_write_json

        atomic_write_json(
            args.out,
            {
                "mode": args.mode,
                "device": str(device),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "torch": torch.__version__,
                "findings": findings,
                "provenance": provenance(config=vars(args)),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
