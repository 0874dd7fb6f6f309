#!/usr/bin/env python
"""Bytes moved per device by each tensor-parallel mode, measured from compiled HLO, next to the
docs/formulas.md formula. Compiles only (nothing executes), so 64 simulated CPU devices are cheap.

  python scripts/bench_comm.py --devices 64 --json comm64.json
  python scripts/bench_comm.py --devices 8 --blocks mlp --modes 2.5d,3d
  python scripts/bench_comm.py --devices 8 --collective-matmul on
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated host devices (default 8)")
    p.add_argument("--json", type=Path, help="write the records to this file")
    p.add_argument("--blocks", default="mlp,layer", help="comma list of mlp, layer")
    p.add_argument("--modes", default="all", help="comma list of 1d, 2d, 2.5d, 3d (default all)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256, help="tokens T = batch·seq (default 4096)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--collective-matmul",
        default="off",
        choices=["on", "off"],
        help="the linears as ppermute rings interleaved with partial matmuls (default off)",
    )
    return p.parse_args(argv)


def fmt_mib(b: float) -> str:
    return f"{b / 2**20:9.2f}"


def main(argv=None) -> int:
    args = parse(argv)
    if args.devices < 1:
        print(f"error: --devices {args.devices} must be at least 1", file=sys.stderr)
        return 2
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    from colossal_jax.tensor.cost import grids
    from colossal_jax_benchmarks.commbench import Shape, measure

    blocks = [b.strip() for b in args.blocks.split(",") if b.strip()]
    for b in blocks:
        if b not in ("mlp", "layer"):
            print(f"error: --blocks {b!r} is not one of mlp, layer", file=sys.stderr)
            return 2
    available = grids(args.devices)
    if args.modes != "all":
        wanted = [m.strip() for m in args.modes.split(",")]
        names = [g.mode for g in available]
        bad = [m for m in wanted if m not in names]
        if bad:
            print(
                f"error: --modes {','.join(bad)} does not fit {args.devices} devices; "
                f"modes that fit: {','.join(names)}",
                file=sys.stderr,
            )
            return 2
        available = [g for g in available if g.mode in wanted]
    shape = Shape(args.batch, args.seq, args.hidden, args.heads, args.dtype)
    print(
        f"T={shape.tokens} tokens (batch {shape.batch} × seq {shape.seq}), h={shape.hidden}, "
        f"heads={shape.heads}, {shape.dtype}, {args.devices} devices; forward + backward; "
        f"collective matmul {args.collective_matmul}"
    )
    header = (
        f"{'block':6} {'mode':5} {'grid':10} {'measured MiB':>12} {'formula MiB':>12} "
        f"{'ratio':>6} {'temp MiB':>10}"
    )
    print(header)
    print("-" * len(header))
    records = []
    for block in blocks:
        for grid in available:
            try:
                rec = measure(grid, block, shape, collective_matmul=args.collective_matmul == "on")
            except ValueError as e:
                print(f"{block:6} {grid.mode:5} {grid.describe():10} skipped: {e}")
                continue
            records.append(rec)
            ratio = f"{rec['ratio']:6.3f}" if rec["ratio"] is not None else "     -"
            temp = fmt_mib(rec["temp_bytes"]) if rec["temp_bytes"] is not None else "-"
            print(
                f"{block:6} {grid.mode:5} {grid.describe():10} "
                f"{fmt_mib(rec['measured_bytes']):>12} {fmt_mib(rec['theory_bytes']):>12} "
                f"{ratio} {temp:>10}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
        print(f"wrote {len(records)} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
