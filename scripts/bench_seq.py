#!/usr/bin/env python
"""Longest sequence per device-memory budget, and bytes moved, for sequence parallelism.

For one transformer layer (forward + backward, fp32, batch 1) and a fixed per-device memory
budget, binary-searches the longest sequence whose compiled program fits (XLA memory analysis,
nothing executes) for: one device, 1D tensor parallelism over N, ring attention, Ulysses and ring
self-attention over N. Then reads each sequence kernel's bytes moved per device from compiled HLO
next to the docs/formulas.md formula.

  python scripts/bench_seq.py --devices 8 --json seq8.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated host devices (default 8)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--budget-mib", type=float, default=256.0, help="per-device bytes (MiB)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--bytes-seq", type=int, default=4096, help="sequence for the bytes table")
    args = p.parse_args(argv)
    n = args.devices
    if n < 2:
        print(f"error: --devices {n} must be at least 2 to split anything", file=sys.stderr)
        return 2
    if args.heads % n:
        print(
            f"error: --heads {args.heads} must be divisible by --devices {n} (1D tensor "
            f"parallelism and Ulysses split heads); use --heads {n * max(1, args.heads // n)}",
            file=sys.stderr,
        )
        return 2
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from colossal_jax_benchmarks.seqbench import (
        attention_bytes,
        candidates,
        layer_memory_bytes,
        longest_sequence,
    )

    budget = int(args.budget_mib * 2**20)
    print(
        f"one layer fwd+bwd, h={args.hidden}, heads={args.heads}, batch {args.batch}, fp32; "
        f"budget {args.budget_mib:g} MiB per device; {n} devices"
    )
    header = f"{'mode':28} {'longest seq':>11} {'x one device':>12} {'MiB at that length':>19}"
    print(header)
    print("-" * len(header))
    rows = []
    base = None
    for cand in candidates(n):
        memo: dict[int, int] = {}

        def size(s: int, cand=cand, memo=memo) -> int:
            if s not in memo:
                memo[s] = layer_memory_bytes(cand, s, hidden=args.hidden, heads=args.heads,
                                             batch=args.batch)  # fmt: skip
            return memo[s]

        mult = max(cand.seq_multiple, 16)
        best = longest_sequence(lambda s, size=size: size(s) <= budget, mult)
        base = best if base is None else base
        row = {
            "mode": cand.name,
            "devices": cand.devices,
            "longest_seq": best,
            "vs_one_device": best / base if base else None,
            "bytes_at_longest": size(best) if best else None,
            "budget_bytes": budget,
        }
        rows.append(row)
        mib = f"{row['bytes_at_longest'] / 2**20:19.1f}" if best else f"{'-':>19}"
        print(f"{cand.name:28} {best:11d} {row['vs_one_device']:12.2f} {mib}", flush=True)

    print()
    print(
        f"bytes per device, attention kernel at seq {args.bytes_seq} "
        "(MiB; formula: docs/formulas.md)"
    )
    cols = ("fwd", "formula", "ratio", "bwd", "formula", "ratio")
    header = f"{'kernel':20} " + " ".join(f"{c:>{6 if c == 'ratio' else 8}}" for c in cols)
    print(header)
    print("-" * len(header))
    comm = []
    for kernel in ("ring", "ulysses", "ring-self-attention"):
        r = attention_bytes(kernel, n, batch=args.batch, seq_len=args.bytes_seq,
                            heads=args.heads, head_dim=args.hidden // args.heads)  # fmt: skip
        comm.append(r)
        mib = lambda b: b / 2**20  # noqa: E731
        print(
            f"{kernel:20} {mib(r['forward_bytes']):8.2f} {mib(r['forward_theory_bytes']):8.2f} "
            f"{r['forward_bytes'] / r['forward_theory_bytes']:6.3f} "
            f"{mib(r['backward_bytes']):8.2f} {mib(r['backward_theory_bytes']):8.2f} "
            f"{r['backward_bytes'] / r['backward_theory_bytes']:6.3f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"longest_sequence": rows, "bytes": comm}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
