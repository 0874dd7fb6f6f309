#!/usr/bin/env python
"""Every plan the planner ranks for a model on N simulated CPU devices, compiled and (with
--steps) run, beside its prediction: a table, JSON and a PNG of predicted against measured step
time and memory, with the Spearman correlation, the largest memory error and the regret of the
planner's choice, by the model alone and by timing the model's first three as scripts/plan.py
--device cpu does (colossal_jax/auto/sweep.py says what each is).

Results are cached on disk (colossal_jax/auto/cache.py), so an interrupted sweep resumes where it
stopped and a finished one reprints at once.

Examples:
  python scripts/sweep_meshes.py --devices 8 --set n_layer=4 --set n_embd=256 \\
      --batch-size 16 --seq-len 256 --steps 5 --json sweep.json --png docs/img/sweep_gpt.png
  python scripts/sweep_meshes.py --devices 8 --filter 'zero=0 remat=none$' --steps 3
  python scripts/sweep_meshes.py --devices 8 --model llama-tiny --set n_layer=4 \\
      --batch-size 16 --seq-len 256 --steps 5 --rounds 3 --sample 12   # each plan's median round

On a GPU (--device h100|h200|a100) the plans run on the real devices, predicted with that
device's hardware model, in bf16 by default; with one GPU the layout is fixed, so
--every-knob sweeps remat, offload and accumulation instead:
  python scripts/sweep_meshes.py --device h100 --devices 1 --every-knob --model gpt2-medium \
      --batch-size 8 --seq-len 1024 --steps 5 --json gpu_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from colossal_jax.cli.model_flags import add_model_flags

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--devices", type=int, default=8, help="devices (default 8; simulated on the CPU)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "h100", "h200", "a100"),
        default="cpu",
        help="the devices to run on and predict for (default cpu: simulated, calibrated model)",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16"),
        help="compute precision (default: fp32 on the CPU, bf16 on a GPU)",
    )
    p.add_argument(
        "--every-knob",
        action="store_true",
        help="every ZeRO/remat/offload/accumulation choice of each layout that fits, not only "
        "the planner's pick (the sweep of one device)",
    )
    add_model_flags(p)
    p.add_argument("--steps", type=int, default=0, help="timed steps per plan (0: compile only)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every plan this many times, in rounds over all of them, and keep each "
        "plan's median round (paired; unpaired its fastest); the summary gives the first "
        "round's correlation and regret beside",
    )
    p.add_argument("--filter", help="a regular expression on plan names (the choice always runs)")
    p.add_argument(
        "--sample",
        type=int,
        help="measure N of the (filtered) plans, spread evenly over the predicted ranking",
    )
    p.add_argument(
        "--unpaired",
        action="store_true",
        help="time plans alone (default: between two steps of the planner's choice, to "
        "normalise away a changing load)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        help="seconds of measuring; then report the plans measured (spread over the ranking)",
    )
    p.add_argument("--memory-gb", type=float, help="budget per device (default: host RAM / N)")
    p.add_argument("--json", type=Path, help="write every row and the summary here")
    p.add_argument("--png", type=Path, help="write the predicted-vs-measured plot here")
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        help="measure nothing: the rows of earlier --json files, predicted again by the "
        "current cost model (several: a plan's row from the last file that measured it)",
    )
    p.add_argument(
        "--current",
        action="store_true",
        help="with --from-json: only the plans the planner lists now (its knobs as chosen now, "
        "--filter applied), each read from the files; the ones no file holds are named",
    )
    p.add_argument(
        "--one-scale",
        action="store_true",
        help="with --from-json: put the files' step times on one scale first (each file's "
        "scale fitted on the plans they share, auto/sweep_scale.py; a plan timed in several "
        "files their geometric mean), since a sweep's normalised times carry its day's host "
        "speed and reference",
    )
    p.add_argument(
        "--fit",
        action="store_true",
        help="with --from-json: print the simulated CPU devices' step costs (hardware.CPU_STEP) "
        "fitted to the sweep's measured times",
    )
    p.add_argument("--cache-dir", type=Path, help="the planner's cache (default: its usual one)")
    return p.parse_args(argv)


def read_sweep(path: Path) -> dict:
    """The JSON of a sweep ``--from-json`` names (``scripts/sweep_meshes.py --json``); a file
    that is missing, not JSON, or not a sweep's raises ``ValueError`` naming the flag."""
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"--from-json {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-json {path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(
            f"--from-json {path} is not a sweep's JSON (no 'rows' list); give a file "
            "scripts/sweep_meshes.py --json wrote"
        )
    need = ("name", "chosen", "parallel", "knobs", "compiled", "measured_step_s", "error")
    for i, row in enumerate(doc["rows"]):
        missing = [k for k in need if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(
                f"--from-json {path}: row {i} lacks {', '.join(missing)}; give a file "
                "scripts/sweep_meshes.py --json wrote"
            )
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds < 1:
        print(f"error: --rounds {args.rounds} must be ≥ 1 (e.g. --rounds 3)", file=sys.stderr)
        return 2
    if args.time_budget is not None and not args.time_budget > 0:
        print(
            f"error: --time-budget {args.time_budget} must be a positive number of seconds "
            "(e.g. --time-budget 3600)",
            file=sys.stderr,
        )
        return 2
    if args.sample is not None and args.sample < 1:
        print(f"error: --sample {args.sample} must be ≥ 1 (e.g. --sample 12)", file=sys.stderr)
        return 2
    if args.devices < 1 or args.steps < 0:
        print(
            f"error: --devices {args.devices} must be ≥ 1 and --steps {args.steps} ≥ 0 "
            "(e.g. --devices 8 --steps 5)",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu":
        from colossal_jax.runtime.devices import simulate_cpu_devices

        simulate_cpu_devices(args.devices, force_cpu=True)
    from colossal_jax.auto import sweep, sweep_report, sweep_summary
    from colossal_jax.auto.choose import budget_of
    from colossal_jax.auto.hardware import hardware
    from colossal_jax.checks.preflight import check_writable_file
    from colossal_jax.cli.model_flags import model_config
    from colossal_jax.config import ConfigError

    t0 = time.perf_counter()
    try:
        # before hours of measuring: an output that cannot be written ends in one line now
        outputs = (("--json", args.json, "sweep.json"), ("--png", args.png, "sweep.png"))
        for flag, path, name in outputs:
            if path is not None:
                check_writable_file(flag, str(path), f"/tmp/{name}", name=name)
        cfg = model_config(args, args.precision or ("fp32" if args.device == "cpu" else "bf16"))
        hw = hardware(args.device, args.memory_gb)
        if args.current and not args.from_json:
            raise ValueError("--current needs --from-json SWEEP.json [MORE.json ...]")
        if args.one_scale and not args.from_json:
            raise ValueError("--one-scale needs --from-json SWEEP.json [MORE.json ...]")
        if args.from_json:
            docs = [read_sweep(path) for path in args.from_json]
            if args.one_scale:
                from colossal_jax.auto.sweep_scale import on_one_scale

                docs = on_one_scale(docs, [f"--from-json {p}" for p in args.from_json])
                print(
                    "scales: "
                    + ", ".join(
                        f"{p.name} {d['scale']:.3f}"
                        for p, d in zip(args.from_json, docs, strict=True)
                    )
                )
            names = None
            if args.current:
                listed = sweep.plans(
                    cfg, args.devices, hw, budget_of(hw, args.devices), args.filter,
                    every_knob=args.every_knob,
                )  # fmt: skip
                names = [r.name for r in listed]
            doc = sweep.merge_json(docs, names)
            if doc["missing"]:
                print(
                    f"{len(doc['missing'])} of the planner's {len(names or [])} plans are in none "
                    f"of the files (e.g. {doc['missing'][0]}): left out",
                    flush=True,
                )
            rows = sweep.rows_from_json(doc, cfg, hw)
            if not rows:
                raise ValueError(
                    f"none of the planner's {len(names or [])} plans is in "
                    f"{', '.join(map(str, args.from_json))}: a sweep of another model or size? "
                    "pass the --model/--set/--batch-size/--seq-len it was taken with, or drop "
                    "--current to read its rows as they are"
                )
        else:
            rows = sweep.plans(
                cfg,
                args.devices,
                hw,
                budget_of(hw, args.devices),
                args.filter,
                args.sample,
                every_knob=args.every_knob,
            )
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(rows)} plans; the planner chose {rows[0].name}", flush=True)
    if args.fit:
        from colossal_jax.auto import fit_cpu

        if not args.from_json:
            print("error: --fit needs --from-json SWEEP.json (a measured sweep)", file=sys.stderr)
            return 2
        try:
            print(json.dumps({"CPU_STEP": fit_cpu.fit(rows, hw)}, indent=1))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    complete = True if args.from_json else measure(rows, args)
    summary = sweep_summary.summarize(rows)
    summary["complete"] = complete
    summary["seconds"] = time.perf_counter() - t0
    print(sweep_report.table(rows))
    print(json.dumps(summary, indent=1))
    write(rows, summary, args, argv, hw.record())
    return 0


def measure(rows: list, args: argparse.Namespace) -> bool:
    """The rows measured with a progress bar (to ``--time-budget``); whether all were."""
    from tqdm import tqdm

    from colossal_jax.auto import sweep
    from colossal_jax.auto.cache import Cache

    total = len(rows) * (args.rounds if args.steps > 0 else 1)
    with tqdm(total=total, desc="plans", unit="plan", file=sys.stderr) as bar:

        def tick(row: sweep.Row) -> None:
            bar.set_postfix_str(row.name[:48])
            bar.update()

        cache = Cache("measured", args.cache_dir) if args.cache_dir else Cache("measured")
        return sweep.run_sweep(
            rows,
            args.steps,
            cache,
            tick,
            paired=not args.unpaired,
            time_budget=args.time_budget,
            rounds=args.rounds,
        )


def write(
    rows: list,
    summary: dict,
    args: argparse.Namespace,
    argv: list[str] | None,
    hardware: dict,
) -> None:
    """The JSON and the PNG asked for; the JSON records the ``hardware`` figures its predictions
    used (the CPU calibration's)."""
    from colossal_jax.auto import sweep_report
    from colossal_jax.auto.search import LEADING

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": " ".join(["python", "scripts/sweep_meshes.py", *(argv or sys.argv[1:])]),
            "summary": summary,
            "hardware": hardware,
            "rows": [r.to_json() for r in rows],
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        sp, regret = summary["spearman"], summary["regret"]
        title = f"{args.model} {' '.join(args.set)} batch {args.batch_size}×{args.seq_len}, "
        title += f"{args.devices} CPU devices: {summary['measured']} plans"
        if sp is not None:
            title += f", Spearman {sp:.2f}"
        if regret is not None:
            title += f", regret {regret * 100:.0f}%"
        if summary.get("regret_timed") is not None:
            title += f" ({summary['regret_timed'] * 100:.0f}% timing the first {LEADING})"
        sweep_report.plot(rows, str(args.png), title)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    sys.exit(main())
