#!/usr/bin/env python
"""Time layouts of a sweep under every remat policy, side by side, and fit the planner's two
remat figures on simulated CPU devices to them (colossal_jax.auto.fit_cpu.fit_remat).

Each layout (a row of a sweep JSON, by name) is compiled once per policy; then every policy
runs one warm-up step and ``--rounds`` rounds of ``--steps`` steps, the policies interleaved
within each round, and the fastest round's median step is kept: drift on the host moves all
policies of a layout alike, and the fit uses only each policy's time relative to the layout's
first policy.

Examples:
  python scripts/remat_ab.py --devices 8 --set n_layer=4 --set n_embd=256 \\
      --batch-size 16 --seq-len 256 --sweep docs/planner_sweep_gpt_all320_full.json \\
      --layout 'data=8 zero=0 remat=none' --json /tmp/remat_ab.json
  python scripts/remat_ab.py --from-json docs/planner_remat_ab.json --fit
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

POLICIES = ("none", "dots", "selective", "full")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--model", default="gpt2-tiny", help="a model size (default gpt2-tiny)")
    p.add_argument("--set", action="append", default=[], help="a model field, e.g. n_layer=4")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--sweep", type=Path, help="the sweep JSON whose rows name the layouts")
    p.add_argument(
        "--layout", action="append", default=[], help="a row name of --sweep (repeatable)"
    )
    p.add_argument(
        "--remat",
        default=",".join(POLICIES),
        help=f"policies, the reference first (default {','.join(POLICIES)})",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--steps", type=int, default=3, help="steps a round (default 3)")
    p.add_argument("--json", type=Path, help="write the timings here")
    p.add_argument("--from-json", type=Path, help="read timings written by --json instead")
    p.add_argument("--fit", action="store_true", help="print the remat figures fitted to them")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policies = [x.strip() for x in args.remat.split(",") if x.strip()]
    bad = [x for x in policies if x not in POLICIES]
    if bad or len(policies) < 2:
        print(
            f"error: --remat {args.remat!r} needs two or more of {', '.join(POLICIES)} "
            "(e.g. --remat none,dots,full)",
            file=sys.stderr,
        )
        return 2
    if args.from_json is None and (args.sweep is None or not args.layout):
        print(
            "error: name layouts with --sweep SWEEP.json --layout NAME, or read timings with "
            "--from-json (e.g. --from-json docs/planner_remat_ab.json --fit)",
            file=sys.stderr,
        )
        return 2
    if args.rounds < 1 or args.steps < 1:
        print(
            f"error: --rounds {args.rounds} and --steps {args.steps} must be ≥ 1 (e.g. --rounds 3)",
            file=sys.stderr,
        )
        return 2
    from colossal_jax.runtime.devices import simulate_cpu_devices

    simulate_cpu_devices(args.devices, force_cpu=True)
    from colossal_jax.config import ConfigError

    try:
        doc = _read(args.from_json) if args.from_json else _measure(args, policies)
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {args.json}")
        if args.fit:
            _fit(doc)
    except (ConfigError, OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _config(doc: dict):
    from colossal_jax.cli.configure import model_overrides
    from colossal_jax.config import TrainConfig

    return TrainConfig(
        model=doc["model"],
        model_overrides=model_overrides(doc["model"], doc["set"]),
        batch_size=doc["batch_size"],
        seq_len=doc["seq_len"],
        devices=doc["devices"],
        precision="fp32",
    )


def _plan(cfg, record: dict):
    from colossal_jax.auto import search
    from colossal_jax.auto.hardware import hardware
    from colossal_jax.auto.space import Knobs
    from colossal_jax.checks.resolve import resolve
    from colossal_jax.config.schema import ParallelConfig

    devices = search.devices_of(hardware("cpu", None), cfg.devices)
    par = ParallelConfig(**record["parallel"])
    return resolve(Knobs(**record["knobs"]).apply(dataclasses.replace(cfg, parallel=par)), devices)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-json {path} is not JSON ({e.msg}, line {e.lineno})") from None


def _measure(args: argparse.Namespace, policies: list[str]) -> dict:
    from colossal_jax.auto.measure import Stepper

    doc = {
        "command": "python " + " ".join(sys.argv),
        "model": args.model,
        "set": args.set,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "devices": args.devices,
        "rows": [],
    }
    cfg = _config(doc)
    sweep = {r["name"]: r for r in _read(args.sweep)["rows"]}
    for name in args.layout:
        if name not in sweep:
            example = next(iter(sweep))
            raise KeyError(f"--layout {name!r} is no row of {args.sweep} (e.g. {example!r})")
        base = sweep[name]
        records = [
            {"layout": name, "parallel": base["parallel"], "knobs": {**base["knobs"], "remat": x}}
            for x in policies
        ]
        steppers = []
        for record in records:
            steppers.append(Stepper(_plan(cfg, record)))
            steppers[-1].time(1)  # the warm-up
        rounds = [[s.time(args.steps) for s in steppers] for _ in range(args.rounds)]
        for i, record in enumerate(records):
            record["rounds"] = [r[i] for r in rounds]
            record["seconds"] = min(record["rounds"])
            doc["rows"].append(record)
        times = ", ".join(f"{r['knobs']['remat']} {r['seconds']:.3f} s" for r in records)
        print(f"{name}: {times}", flush=True)
        del steppers
    return doc


def _fit(doc: dict) -> None:
    from colossal_jax.auto import cost, fit_cpu
    from colossal_jax.auto.hardware import hardware

    hw = hardware("cpu", None)
    cfg = _config(doc)
    groups: dict[str, list] = {}
    for record in doc["rows"]:
        groups.setdefault(record["layout"], []).append((_plan(cfg, record), record["seconds"]))
    figures = fit_cpu.fit_remat(list(groups.values()), hw)
    print(json.dumps({"CPU_STEP": figures}, indent=1))
    print("each policy against its layout's first, measured and predicted (shipped figures):")
    for name, group in groups.items():
        ref_plan, ref_s = group[0]
        ref_p = cost.predict(ref_plan, hw).step_s
        cells = [
            f"{p.remat} {s / ref_s:.2f}/{cost.predict(p, hw).step_s / ref_p:.2f}"
            for p, s in group[1:]
        ]
        print(f"  {name}: " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
