#!/usr/bin/env python
"""Calibrate this machine's CPU for the planner: host matmul FLOP/s and α-β of collectives on
simulated devices (colossal_jax/auto/calibrate.py says exactly what is measured), written as
the JSON ``colossal_jax.auto.hardware.load_cpu`` reads.

Example:
  python scripts/calibrate_cpu.py --devices 8            # → ~/.cache/colossal_jax/planner/cpu.json
  python scripts/calibrate_cpu.py --devices 8 --quick --out /tmp/cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--out", type=Path, help="where to write (default: the planner's CPU path)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point (median)")
    p.add_argument("--quick", action="store_true", help="two payloads, one matmul shape")
    args = p.parse_args(argv)
    if args.devices < 2 or args.repeats < 1:
        print(
            f"error: --devices {args.devices} must be at least 2 and --repeats {args.repeats} "
            "at least 1 (e.g. --devices 8 --repeats 5)",
            file=sys.stderr,
        )
        return 2
    from colossal_jax.checks.preflight import check_writable_file
    from colossal_jax.config import ConfigError

    if args.out is not None:
        try:
            check_writable_file("--out", str(args.out), "/tmp/cpu.json", name="cpu.json")
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from colossal_jax.runtime.devices import simulate_cpu_devices

    simulate_cpu_devices(args.devices, force_cpu=True)
    from colossal_jax.auto import calibrate as cal
    from colossal_jax.auto.hardware import calibration_path

    kw = {}
    if args.quick:
        kw = {"payloads": (64 << 10, 2 << 20), "shapes": (cal.MATMUL_SHAPES[-1],)}
    doc = cal.calibrate(repeats=args.repeats, **kw)
    out = args.out or calibration_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"host matmul {doc['flops_per_s'] / 1e9:.2f} GFLOP/s over {doc['devices']} devices; "
        f"collectives α {doc['alpha_s'] * 1e6:.0f} µs, β {doc['beta_bytes_per_s'] / 1e9:.2f} GB/s "
        f"per device; {doc['note']}"
    )
    for name, fit in doc["collectives"]["fits"].items():
        alpha, beta = fit["alpha_s"] * 1e6, fit["beta_bytes_per_s"] / 1e9
        print(f"  {name:22s} α {alpha:8.0f} µs  β {beta:6.2f} GB/s")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
