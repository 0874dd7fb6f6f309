#!/usr/bin/env python
"""Step time with ``--collective-matmul on`` against ``off``: ``scripts/train.py`` runs,
interleaved (off/on, then on/off, ...) so that a machine whose load drifts treats both alike.

Each run's step time is the median of its ``step_time_s`` (metrics file) after the first
``--skip`` steps; a flag's figure is the median over its runs. Prints a table and the exact
commands; ``--json`` writes the per-run figures.

  python scripts/bench_collective_matmul.py --modes 1d,2d,3d --repeats 3 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MESHES = {
    "1d": ["--mesh", "tensor=8", "--tensor-mode", "1d"],
    "2d": ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d"],
    "2.5d": ["--mesh", "tensor=8", "--tensor-mode", "2.5d", "--tensor-depth", "2"],
    "3d": ["--mesh", "tensor=8", "--tensor-mode", "3d"],
}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--modes", default="1d,2d,3d", help=f"comma list of {', '.join(MESHES)}")
    p.add_argument("--repeats", type=int, default=3, help="runs per flag value (default 3)")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--skip", type=int, default=2, help="first steps left out (default 2)")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--json", type=Path, help="write the per-run records here")
    p.add_argument("extra", nargs="*", help="more train.py flags, after --")
    return p.parse_args(argv)


def command(mode: str, flag: str, args, metrics: Path) -> list[str]:
    return [
        sys.executable,
        "scripts/train.py",
        *MESHES[mode],
        "--steps",
        str(args.steps),
        "--devices",
        str(args.devices),
        "--eval-every",
        "0",
        "--no-progress",
        "--collective-matmul",
        flag,
        "--metrics-file",
        str(metrics),
        *args.extra,
    ]


def step_time(metrics: Path, skip: int) -> float:
    times = [
        r["step_time_s"]
        for r in map(json.loads, metrics.read_text().splitlines())
        if "step_time_s" in r and r["step"] > skip
    ]
    return statistics.median(times)


def main(argv=None) -> int:
    args = parse(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MESHES]
    if bad or args.repeats < 1 or args.steps <= args.skip:
        print(
            f"error: --modes from {', '.join(MESHES)}, --repeats ≥ 1, --steps > --skip",
            file=sys.stderr,
        )
        return 2
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            for r in range(args.repeats):
                for flag in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    metrics = Path(tmp) / f"{mode}-{flag}-{r}.jsonl"
                    cmd = command(mode, flag, args, metrics)
                    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
                    t = step_time(metrics, args.skip)
                    records.append({"mode": mode, "collective_matmul": flag, "run": r, "step_s": t})
                    print(f"{mode:5} {flag:3} run {r}: median step {t * 1e3:8.1f} ms", flush=True)
    print("\n| mode | off: median step (ms) | on: median step (ms) | on / off | runs each |")
    print("|---|---|---|---|---|")
    for mode in modes:
        med = {
            f: statistics.median(
                x["step_s"] for x in records if x["mode"] == mode and x["collective_matmul"] == f
            )
            for f in ("off", "on")
        }
        print(
            f"| {mode} | {med['off'] * 1e3:.1f} | {med['on'] * 1e3:.1f} | "
            f"{med['on'] / med['off']:.3f} | {args.repeats} |"
        )
    print("\ncommands (metrics file per run):")
    for mode in modes:
        for flag in ("off", "on"):
            shown = command(mode, flag, args, Path("run.jsonl"))
            print("  python " + " ".join(shown[1:]))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
