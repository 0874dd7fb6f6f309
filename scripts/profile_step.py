#!/usr/bin/env python
"""Where one plan's step time goes on N simulated CPU devices: XLA's trace of a few steps,
summed by kind of operation (matmuls, collectives, slot reads and writes, zero fills, copies,
other fusions), and the instructions that cost most (colossal_jax/auto/profile.py says how,
and why the figures are thread seconds summed over the devices).

The plan is the first of the planner's plans (every knob of every layout, in predicted order)
whose name matches --plan, as scripts/sweep_meshes.py names them.

Examples:
  python scripts/profile_step.py --devices 8 --set n_layer=4 --set n_embd=256 \\
      --batch-size 16 --seq-len 256 --plan '^pipe=2,seq=4 sp=ulysses pp=gpipe/M4 zero=0 remat=none$'
  python scripts/profile_step.py --devices 8 --plan '^data=8 zero=0 remat=full$' --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from colossal_jax.cli.model_flags import add_model_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    add_model_flags(p)
    p.add_argument(
        "--plan",
        required=True,
        help="a regular expression on plan names; the first match in predicted order is traced",
    )
    p.add_argument("--steps", type=int, default=3, help="traced steps (default 3)")
    p.add_argument("--top", type=int, default=20, help="instructions listed (default 20)")
    p.add_argument("--json", type=Path, help="write the breakdown here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices < 1 or args.steps < 1 or args.top < 0:
        print(
            f"error: --devices {args.devices} and --steps {args.steps} must be ≥ 1 and --top "
            f"{args.top} ≥ 0 (e.g. --devices 8 --steps 3)",
            file=sys.stderr,
        )
        return 2
    from colossal_jax.runtime.devices import simulate_cpu_devices

    simulate_cpu_devices(args.devices, force_cpu=True)
    from colossal_jax.auto import profile, sweep
    from colossal_jax.auto.choose import budget_of
    from colossal_jax.auto.hardware import hardware
    from colossal_jax.checks.preflight import check_writable_file
    from colossal_jax.cli.model_flags import model_config
    from colossal_jax.config import ConfigError

    try:
        if args.json is not None:
            check_writable_file("--json", str(args.json), "/tmp/profile.json", name="profile")
        cfg = model_config(args, "fp32")
        hw = hardware("cpu", None)
        try:
            wanted = re.compile(args.plan)
        except re.error as e:
            raise ConfigError(f"--plan {args.plan!r} is not a regular expression ({e})") from None
        rows = sweep.plans(cfg, args.devices, hw, budget_of(hw, args.devices), every_knob=True)
        matches = [r for r in rows if wanted.search(r.name)]
        if not matches:
            raise ConfigError(
                f"--plan {args.plan!r} matches none of the planner's {len(rows)} plans (names "
                f"look like {rows[0].name!r})"
            )
        row = matches[0]
        print(f"tracing {row.name} ({len(matches)} plans matched; the first in predicted order)")
        b = profile.profile_plan(row.ranked.plan, args.steps, args.top)
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(profile.report(row.name, b))
    if args.json is not None:
        doc = {"plan": row.name, "command": sys.argv, **dataclasses.asdict(b)}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
