#!/usr/bin/env python
"""Record, or compare bit for bit, the loss sequences of six reference runs.

  python scripts/same_losses.py record --root /path/to/checkout --out before.json
  python scripts/same_losses.py record --out after.json          # this checkout
  python scripts/same_losses.py compare before.json after.json

``record`` runs ``scripts/train.py`` of the checkout at ``--root`` (this one by default) once
per reference configuration (the default run, 2D tensor, a 1F1B pipeline, ZeRO-3 with
accumulation, BERT and ViT) with ``--metrics-file`` and keeps every step's training loss and every
held-out loss, as the exact decimal strings JSON wrote. ``compare`` prints one line per run and
exits with status 1 unless every sequence is identical: a refactoring that changes no behaviour
must leave these bits alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS: dict[str, list[str]] = {
    "default": [],
    "2d": ["--mesh", "data=2,tensor=4", "--tensor-mode", "2d"],
    "1f1b": ["--mesh", "pipe=2,data=4", "--pipeline", "1f1b", "--set", "model.n_layer=4"],
    "zero3-accum": ["--zero", "3", "--grad-accum", "2"],
    "bert-tiny": ["--model", "bert-tiny"],
    "vit-tiny": ["--model", "vit-tiny"],
}


def _losses(metrics: Path) -> dict[str, list[str]]:
    """Training and held-out losses of a metrics file, as the strings JSON wrote."""
    out: dict[str, list[str]] = {"loss": [], "eval_loss": []}
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line, parse_float=str)
        for key in out:
            if key in rec:
                out[key].append(f"{rec['step']}:{rec[key]}")
    return out


def record(root: Path, out: Path, runs: list[str], extra: list[str]) -> int:
    result: dict[str, dict[str, list[str]]] = {}
    env = dict(os.environ, PYTHONPATH=str(root))
    for name in runs:
        with tempfile.TemporaryDirectory() as tmp:
            metrics = Path(tmp) / "m.jsonl"
            cmd = [sys.executable, str(root / "scripts" / "train.py"), *RUNS[name], *extra,
                   "--metrics-file", str(metrics)]
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            result[name] = _losses(metrics)
            print(f"{name}: {len(result[name]['loss'])} steps recorded", flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def compare(a: Path, b: Path) -> int:
    before, after = json.loads(a.read_text()), json.loads(b.read_text())
    same = True
    for name in before:
        if name not in after:
            print(f"{name:12s} missing from {b}")
            same = False
            continue
        n = len(before[name]["loss"])
        ok = before[name] == after[name]
        same &= ok
        last = before[name]["loss"][-1] if n else "-"
        print(f"{name:12s} {n:4d} steps, {len(before[name]['eval_loss'])} evaluations, "
              f"final {last}: {'bit-identical' if ok else 'DIFFERENT'}")
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of the runs")
    r.add_argument("extra", nargs="*", help="flags appended to every run (after --)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "compare":
        return compare(args.before, args.after)
    unknown = [n for n in args.runs.split(",") if n not in RUNS]
    if unknown:
        print(f"error: --runs {unknown[0]!r} is not one of {', '.join(RUNS)}", file=sys.stderr)
        return 2
    return record(args.root.resolve(), args.out, args.runs.split(","), args.extra)


if __name__ == "__main__":
    sys.exit(main())
