#!/usr/bin/env python
"""How long ``resolve(config, devices) -> Plan`` takes: the figure an automatic planner, which
resolves thousands of candidate plans, is bound by. No JAX is imported.

  python scripts/bench_resolve.py                    # 64 GPU devices of 80 GB, data=8, 1D tensor=8
  python scripts/bench_resolve.py --calls 2000 --mesh data=4,pipe=2,tensor=8 --tensor-mode 2d

Prints the median, 10th and 90th percentile of ``--calls`` calls (after one untimed call that
fills the file caches) and the plans per second the median allows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig, parse_mesh
from colossal_jax.config.plan import Devices


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=64)
    p.add_argument("--mesh", default="data=8,tensor=8")
    p.add_argument("--tensor-mode", default="1d")
    p.add_argument("--model", default="gpt2-medium")
    p.add_argument("--calls", type=int, default=1000)
    args = p.parse_args(argv)
    try:
        sizes = parse_mesh(args.mesh, args.devices, tensor_mode=args.tensor_mode)
        cfg = TrainConfig(
            model=args.model,
            batch_size=64,
            parallel=ParallelConfig(**sizes, tensor_mode=args.tensor_mode),
        )
        devices = Devices(args.devices, platform="gpu", memory_bytes=80 * 2**30)
        resolve(cfg, devices)  # fills the caches, as a planner's first candidate does
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    times = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        resolve(cfg, devices)
        times.append(time.perf_counter() - t0)
    q = statistics.quantiles(times, n=10)
    median = statistics.median(times)
    print(
        f"resolve {args.model} on {args.devices} devices ({args.mesh}, {args.tensor_mode}): "
        f"median {median * 1e6:.0f} µs (p10 {q[0] * 1e6:.0f}, p90 {q[-1] * 1e6:.0f}) over "
        f"{args.calls} calls; {1 / median:,.0f} plans/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
