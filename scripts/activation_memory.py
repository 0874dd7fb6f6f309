#!/usr/bin/env python
"""Per-device temporary (activation) bytes of one transformer layer, forward + backward, from
XLA's compiled memory analysis, for every tensor mode at several device counts.

  python scripts/activation_memory.py --devices 1,4,8,16,64 --json act.json

Each device count runs ``scripts/bench_comm.py --blocks layer`` in its own process (the number
of simulated devices is fixed when JAX starts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("none", "1d", "2d", "2.5d", "3d")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", default="1,4,8,16,64", help="comma list of device counts")
    p.add_argument("--json", type=Path, help="write all records here")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=64)
    args = p.parse_args(argv)
    try:
        counts = [int(n) for n in args.devices.split(",")]
    except ValueError:
        print(
            f"error: --devices {args.devices!r} must be a comma list of integers", file=sys.stderr
        )
        return 2
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            out = Path(tmp) / f"{n}.json"
            cmd = [
                sys.executable, str(HERE / "bench_comm.py"), "--devices", str(n), "--blocks",
                "layer", "--json", str(out), "--batch", str(args.batch), "--seq", str(args.seq),
                "--hidden", str(args.hidden), "--heads", str(args.heads),
            ]  # fmt: skip
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            records += json.loads(out.read_text())
    by = {(r["mode"], r["devices"]): r for r in records}
    print(
        f"temp MiB per device, one layer fwd+bwd, T={args.batch * args.seq}, h={args.hidden}, fp32"
    )
    print(f"{'p':>4} " + " ".join(f"{m:>14}" for m in MODES))
    for n in counts:
        cells = []
        for m in MODES:
            r = by.get((m, n))
            cells.append(f"{r['temp_bytes'] / 2**20:8.1f} ({r['grid']})" if r else "-")
        print(f"{n:>4} " + " ".join(f"{c:>14}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
