"""How step time grows with depth: ``scripts/bench_depth.py [train flags] --layers 2,8``.

Builds the run of the given flags once per depth (``model.n_layer``), compiles its step (and,
with ``--baseline plain-jax``, the plain-JAX GPT's at the same depth), then runs every compiled
step in turn, ``--timed-steps`` times after ``--bench-warmup`` untimed rounds, alternating the
order each round. Per depth: wall-clock step time (min, median) and the process's CPU time per
step (``time.process_time``: what the step costs the machine, less sensitive to other jobs than
wall time), and the median of the paired ratios ``t(L) / t(first depth)`` of each side.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from typing import Any

from colossal_jax.config import ConfigError
from colossal_jax.config.model_rules import check_baseline
from colossal_jax.config.train_rules import check_bench


def main(argv: list[str] | None = None) -> int:
    from colossal_jax import cli
    from colossal_jax_benchmarks.throughput import _LibrarySide, _PlainSide, append_record

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = cli.build_parser()
        parser.prog = "bench_depth.py"
        parser.description = "Step time of the library's training step at several depths."
        a = parser.add_argument
        a("--layers", default="2,8", help="comma-separated depths, e.g. 2,8")
        a("--baseline", default="none", help="none or plain-jax (also timed at every depth)")
        a("--timed-steps", type=int, default=20, help="timed rounds (each runs every step once)")
        a("--bench-warmup", type=int, default=2, help="untimed rounds first")
        a("--json", default=None, help="append the record to this JSON list")
        parser.set_defaults(eval_every=0)
        args = parser.parse_args(argv)
        depths = [int(x) for x in args.layers.split(",")]
        if len(depths) < 2 or min(depths) < 1:
            raise ConfigError(f"--layers {args.layers} needs two or more depths, e.g. 2,8")


        check_bench(args.baseline, args.timed_steps, args.bench_warmup)
        cli._setup_devices(args)
        cli.apply_xla_preset(args.xla_preset)
        import jax

        n = args.devices or jax.device_count()
        base_cfg = cli.config_from_args(args, n)
        check_baseline(base_cfg, args.baseline)
        sides: dict[tuple[str, int], Any] = {}
        for depth in depths:
            overrides = {**base_cfg.model_overrides, "n_layer": depth}
            cfg = dataclasses.replace(base_cfg, devices=n, eval_every=0, model_overrides=overrides)
            lib = _LibrarySide(cfg)
            sides[("library", depth)] = lib
            if args.baseline == "plain-jax":
                sides[("plain-jax", depth)] = _PlainSide(lib)
        record = time_depths(sides, args.timed_steps, args.bench_warmup, depths)
        record = {"flags": argv, "device": jax.devices()[0].device_kind, **record}
        if args.json:
            append_record(args.json, record)
        for name, ratio in record["ratios"].items():
            print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def time_depths(sides: dict, timed: int, warmup: int, depths: list[int]) -> dict[str, Any]:
    keys = list(sides)
    wall = {k: [] for k in keys}
    cpu = {k: [] for k in keys}
    batches = {k: sides[k].batch(0) for k in keys}
    for i in range(warmup + timed):
        for k in keys if i % 2 == 0 else keys[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            sides[k](batches[k])
            if i >= warmup:
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    per_depth = {
        f"{name} L={d}": {
            "wall_s": {"min": min(wall[(name, d)]), "median": statistics.median(wall[(name, d)])},
            "cpu_s_median": statistics.median(cpu[(name, d)]),
        }
        for name, d in keys
    }
    ratios = {}
    for name in dict.fromkeys(n for n, _ in keys):
        first = (name, depths[0])
        out = {}
        for d in depths[1:]:
            k = (name, d)
            out[f"wall t{d}/t{depths[0]}"] = statistics.median(
                a / b for a, b in zip(wall[k], wall[first], strict=True)
            )
            out[f"cpu t{d}/t{depths[0]}"] = statistics.median(
                a / b for a, b in zip(cpu[k], cpu[first], strict=True)
            )
        ratios[name] = out
    return {"depths": depths, "timed_steps": timed, "per_depth": per_depth, "ratios": ratios}


if __name__ == "__main__":
    sys.exit(main())
