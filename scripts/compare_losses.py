#!/usr/bin/env python
"""Compare the per-step losses of metrics files (JSON lines from ``train.py --metrics-file``).

  python scripts/compare_losses.py base.jsonl other.jsonl [more.jsonl ...] --rtol 1e-4

Prints the largest relative difference of each file's losses from the first file's, step by
step, and exits with status 1 if any exceeds ``--rtol`` (or the steps differ).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> dict[int, float]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if "loss" in rec:  # the step-0 record holds only the untrained eval_loss
                out[int(rec["step"])] = float(rec["loss"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("base", type=Path)
    p.add_argument("others", type=Path, nargs="+")
    p.add_argument("--rtol", type=float, default=1e-4)
    args = p.parse_args(argv)
    for f in (args.base, *args.others):
        if not f.is_file():
            print(f"error: {f} is not a file", file=sys.stderr)
            return 2
    base = load(args.base)
    ok = True
    for other in args.others:
        got = load(other)
        if sorted(got) != sorted(base):
            print(f"{other}: steps {sorted(got)} differ from {args.base}'s {sorted(base)}")
            ok = False
            continue
        worst = max(abs(got[s] - base[s]) / abs(base[s]) for s in base)
        verdict = "ok" if worst <= args.rtol else "DIFFERENT"
        ok &= worst <= args.rtol
        print(f"{other}: {len(base)} steps, max relative difference {worst:.2e} ({verdict})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
