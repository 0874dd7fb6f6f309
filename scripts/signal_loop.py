#!/usr/bin/env python
"""Send SIGINT (or SIGTERM) to a short training run at random moments from launch to its end
and check that every run stops cleanly: no death by signal (return code < 0, or 139 for a
segmentation fault), no traceback, exit status 130/143 with one ``interrupted ...`` line (or 0
when the signal came after the run's end).

    python scripts/signal_loop.py --moments 20            # SIGINT, 20 fresh runs
    python scripts/signal_loop.py --moments 5 --signal TERM
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crashlib  # noqa: E402


def one(workdir: Path, steps: int, delay: float, sig: signal.Signals) -> tuple[bool, str, float]:
    """Launch, signal after ``delay`` s; (clean, description, exit latency in s)."""
    run = Path(tempfile.mkdtemp(prefix="run", dir=workdir))
    cmd = crashlib.command(steps, run / "ck", run / "m.jsonl", 5)
    proc = subprocess.Popen(
        cmd, env=crashlib.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return False, f"delay {delay:.2f}s: no exit within 120 s", 120.0
    latency = time.monotonic() - sent
    rc = proc.returncode
    last = (err.strip().splitlines() or [""])[-1]
    expected = 128 + int(sig)
    clean = rc >= 0 and rc != 139 and "Traceback" not in err
    clean = clean and (rc == 0 or (rc == expected and last.startswith("interrupted")))
    return clean, f"delay {delay:5.2f}s rc {rc:3d} exit {latency:4.1f}s  {last[:110]}", latency


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--moments", type=int, default=20)
    p.add_argument("--signal", default="INT", choices=("INT", "TERM"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sig = signal.Signals[f"SIG{args.signal}"]
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="signal-loop-") as tmp:
        workdir = Path(tmp)
        _, length = crashlib.reference(workdir, args.steps, 5)
        print(f"an uninterrupted run takes {length:.1f}s; signalling {sig.name} at "
              f"{args.moments} random moments in [0, {length:.1f}] s", flush=True)  # fmt: skip
        bad, latencies = 0, []
        for delay in sorted(rng.uniform(0, length) for _ in range(args.moments)):
            clean, what, latency = one(workdir, args.steps, delay, sig)
            bad += not clean
            latencies.append(latency)
            print(("ok   " if clean else "FAIL ") + what, flush=True)
    print(
        f"{args.moments - bad}/{args.moments} clean; exit latency max {max(latencies):.1f}s, "
        f"mean {sum(latencies) / len(latencies):.1f}s; loop took {time.monotonic() - t0:.0f}s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
