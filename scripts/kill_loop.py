#!/usr/bin/env python
"""SIGKILL a training run again and again and check that nothing is lost.

Runs the small model with a checkpoint every 2 steps, kills it with SIGKILL at ``--kills``
moments (every other one right after a step that starts an asynchronous save, the others at a
random time), restarts it each time, and once truncates a data file of the latest checkpoint
before a restart (that restart must warn and resume from the checkpoint before). At the end the
per-step losses (the last record of each step in the metrics file) must equal those of an
uninterrupted run bit for bit.

    python scripts/kill_loop.py                 # 10 kills
    python scripts/kill_loop.py --kills 3 --steps 16
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

EVERY = 2


def _steps_on_disk(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def _truncate_latest(ckpt: Path) -> tuple[int, int]:
    """Halve the largest data file of the latest checkpoint: (that step, the one before)."""
    steps = _steps_on_disk(ckpt)
    data = [p for p in (ckpt / str(steps[-1]) / "state").rglob("*") if p.is_file()]
    victim = max((p for p in data if p.parent.name == "d"), key=lambda p: p.stat().st_size)
    with victim.open("r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    return steps[-1], steps[-2]


def _wait(proc: subprocess.Popen, until, timeout: float = 120.0) -> bool:
    """Poll until ``until()`` holds (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if until():
            return True
        time.sleep(0.01)
    return False


def kill_loop(kills: int, steps: int, seed: int, workdir: Path) -> list[str]:
    """Run the loop; the problems found (empty: all held)."""
    rng = random.Random(seed)
    ref, length = crashlib.reference(workdir, steps, EVERY)
    print(f"reference: {steps} steps in {length:.1f}s", flush=True)
    ckpt, metrics = workdir / "ck", workdir / "killed.jsonl"
    cmd = crashlib.command(steps, ckpt, metrics, EVERY)
    problems: list[str] = []
    truncate_at = kills // 2
    expect: tuple[int, int] | None = None
    for i in range(kills):
        if i >= truncate_at and expect is None and len(_steps_on_disk(ckpt)) >= 2:
            expect = _truncate_latest(ckpt)
            print(f"  truncated a file of checkpoint step {expect[0]}", flush=True)
        err_path = workdir / f"err{i}.txt"
        with err_path.open("w") as err:
            proc = subprocess.Popen(cmd, env=crashlib.env(), stdout=subprocess.DEVNULL, stderr=err)
            start = crashlib.last_step(metrics)
            if expect is not None and expect[0] > 0:  # let the restart restore first
                _wait(proc, lambda p=err_path: "using step" in p.read_text())
            if i % 2 == 0:  # right after a step that saves: the save is in flight
                target = min(start + 1 + rng.randrange(1, 4), steps - 1)
                target += target % EVERY
                reached = _wait(proc, lambda t=target: crashlib.last_step(metrics) >= t)
                how = f"after step {target} (async save)"
                time.sleep(rng.uniform(0, 0.05))
            else:
                reached = _wait(proc, lambda: False, timeout=rng.uniform(0.5, length))
                how = "at a random time"
                reached = proc.poll() is None
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        text = err_path.read_text()
        if expect is not None and expect[0] > 0:
            want = (
                f"warning: checkpoint step {expect[0]} in {ckpt.resolve()} is incomplete or corrupt"
            )
            if want not in text or f"using step {expect[1]}" not in text:
                problems.append(f"kill {i}: the restart did not warn about step {expect[0]}")
            else:
                print(f"  restart warned and used step {expect[1]}", flush=True)
            expect = (0, 0)  # checked once
        if "Traceback" in text:  # reported, not a failure: SIGKILL's contract is the losses
            tail = text[text.index("Traceback") :].strip().splitlines()[-1][:200]
            print(f"  note: kill {i}: a traceback in stderr before the kill ({tail})", flush=True)
        state = "killed" if proc.returncode == -signal.SIGKILL else f"rc {proc.returncode}"
        print(
            f"kill {i + 1}/{kills} {how}: {state} at step {crashlib.last_step(metrics)}; "
            f"on disk {_steps_on_disk(ckpt)}" + ("" if reached else " (ended first)"),
            flush=True,
        )
    if expect is None and len(_steps_on_disk(ckpt)) < 2:
        # the kills came before two checkpoints were down: one more run, killed once they are
        with (workdir / "err_extra.txt").open("w") as err:
            proc = subprocess.Popen(cmd, env=crashlib.env(), stdout=subprocess.DEVNULL, stderr=err)
            _wait(proc, lambda: len(_steps_on_disk(ckpt)) >= 2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        print(f"extra run killed with {_steps_on_disk(ckpt)} on disk", flush=True)
    if expect is None and len(_steps_on_disk(ckpt)) >= 2:  # the kills came early: truncate now
        expect = _truncate_latest(ckpt)
        print(f"  truncated a file of checkpoint step {expect[0]} before the final run", flush=True)
    done = subprocess.run(cmd, env=crashlib.env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        problems.append(f"the final run exited {done.returncode}: {done.stderr[-300:]}")
    if expect is None:
        problems.append("no truncation happened (too few checkpoints on disk)")
    elif expect[0] > 0:
        want = f"warning: checkpoint step {expect[0]} in {ckpt.resolve()} is incomplete or corrupt"
        if want not in done.stderr or f"using step {expect[1]}" not in done.stderr:
            problems.append(f"the final run did not warn about step {expect[0]}")
        else:
            print(f"  the final run warned and used step {expect[1]}", flush=True)
    got = crashlib.losses(metrics)
    if got != ref:
        diff = [s for s in ref if got.get(s) != ref[s]]
        problems.append(f"losses differ from the uninterrupted run at steps {diff[:10]}")
    else:
        print(f"losses of all {len(ref)} steps equal the uninterrupted run's bit for bit")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-loop-") as tmp:
        problems = kill_loop(args.kills, args.steps, args.seed, Path(tmp))
    for line in problems:
        print(f"FAIL {line}")
    print(f"kill loop: {args.kills} kills, {'ok' if not problems else 'FAILED'}; "
          f"took {time.monotonic() - t0:.0f}s")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
