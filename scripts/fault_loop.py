#!/usr/bin/env python
"""Damage a training run's checkpoints again and again and check that nothing is lost and every
fault is said in one line.

Runs the small model with a checkpoint every 2 steps. Each round picks (seeded) one fault:

- ``truncate``: halve the largest array file of the latest checkpoint;
- ``metadata``: empty or garble (random bytes) one metadata file of the latest checkpoint;
- ``delete``: delete one subfolder of the latest checkpoint;
- ``stray``: make an empty numbered folder after the latest checkpoint;
- ``full-disk``: re-run with the disk full from the next save on (``ENOSPC`` in orbax's writer
  threads, :func:`crashlib.full_disk_from`);
- ``sigkill``: re-run and SIGKILL it right after a step that starts an asynchronous save;

(a training already at its last step first loses its last checkpoint, as if it had never been
saved, so that the full disk or the kill meets a save)
then re-runs the same command (after a damage) and checks its standard error: no
``Traceback``, and besides ``note:`` lines at most one line, a ``warning:`` (a damaged
checkpoint moved aside) or an ``error:`` (the full disk, exit status 2). A damage orbax does not
need to read (a garbled ``_sharding``, say) may pass without a warning: the round says so. At
the end a last run completes the training and its per-step losses (the last record of each step
in the metrics file) must equal those of an undamaged run bit for bit.

    python scripts/fault_loop.py                     # 20 rounds
    python scripts/fault_loop.py --rounds 6 --seed 3 --steps 8
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crashlib  # noqa: E402

EVERY = 2
FAULTS = ("truncate", "metadata", "delete", "stray", "full-disk", "sigkill")
METADATA = (
    "_CHECKPOINT_METADATA", "meta/metadata", "state/_METADATA", "state/_sharding",
    "state/manifest.ocdbt",
)  # fmt: skip
SUBFOLDERS = ("meta", "state", "state/d", "state/ocdbt.process_0", "state/array_metadatas")


def _steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def damage(kind: str, ckpt: Path, rng: random.Random) -> str:
    """Apply the damage ``kind`` to the latest checkpoint in ``ckpt``; what was done."""
    latest = ckpt / str(_steps(ckpt)[-1])
    if kind == "truncate":
        data = [p for p in (latest / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
        victim = max(data, key=lambda p: p.stat().st_size)
        with victim.open("r+b") as f:
            f.truncate(victim.stat().st_size // 2)
        return f"truncated {victim.relative_to(ckpt)}"
    if kind == "metadata":
        victim = latest / rng.choice(METADATA)
        garble = rng.random() < 0.5
        victim.write_bytes(rng.randbytes(64) if garble else b"")
        return f"{'garbled' if garble else 'emptied'} {victim.relative_to(ckpt)}"
    if kind == "delete":
        victim = latest / rng.choice(SUBFOLDERS)
        shutil.rmtree(victim)
        return f"deleted {victim.relative_to(ckpt)}/"
    stray = ckpt / str(int(latest.name) + EVERY + 1)
    stray.mkdir()
    return f"made an empty {stray.name}/"


def _kill_during_save(cmd: list[str], metrics: Path, err, rng: random.Random, steps: int) -> str:
    """Run ``cmd`` and SIGKILL it right after a step that saves; how it ended."""
    start = crashlib.last_step(metrics)
    target = min(start + 1 + rng.randrange(1, 4), steps - 1)
    target += target % EVERY
    proc = subprocess.Popen(cmd, env=crashlib.env(), stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if crashlib.last_step(metrics) >= target:
            time.sleep(rng.uniform(0, 0.05))
            break
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return "killed" if proc.returncode == -signal.SIGKILL else f"ended first (rc {proc.returncode})"


def _lines(text: str) -> list[str]:
    """The lines of a standard error that are not notes."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("note:")]


def one_round(i: int, kind: str, ckpt: Path, metrics: Path, workdir: Path, steps: int,
              rng: random.Random) -> tuple[str, list[str]]:  # fmt: skip
    """Round ``i``: its line and the problems found."""
    cmd = crashlib.command(steps, ckpt, metrics, EVERY)
    err_path = workdir / f"err{i}.txt"
    before = _steps(ckpt)
    problems: list[str] = []
    with err_path.open("w") as err:
        if kind == "sigkill":
            what = _kill_during_save(cmd, metrics, err, rng, steps)
            rc = None
        else:
            what = damage(kind, ckpt, rng) if kind != "full-disk" else "disk full"
            if kind == "full-disk":
                at = min((before[-1] if before else 0) + EVERY, steps)
                cmd = crashlib.full_disk_command(cmd, at)
                what = f"disk full from the save of step {at}"
            rc = subprocess.run(cmd, env=crashlib.env(), stdout=subprocess.DEVNULL, stderr=err,
                                timeout=600).returncode  # fmt: skip
    text = err_path.read_text()
    said = _lines(text)
    if "Traceback" in text:
        problems.append(f"round {i + 1} ({kind}): a traceback in stderr")
    if len(said) > 1:
        problems.append(f"round {i + 1} ({kind}): {len(said)} lines, not one: {said[:3]}")
    elif said and not said[0].startswith(("warning: ", "error: ")):
        problems.append(f"round {i + 1} ({kind}): not a warning or error: {said[0][:200]}")
    if kind == "full-disk":
        committed = [s for s in _steps(ckpt) if s in before]
        if committed != before:
            problems.append(f"round {i + 1}: the full disk removed committed steps {before}")
        if rc not in (0, 2) or (rc == 2 and not said):
            problems.append(f"round {i + 1}: the full disk ended with rc {rc}")
    elif kind != "sigkill" and rc != 0:
        problems.append(f"round {i + 1} ({kind}): the re-run exited {rc}")
    ended = f"rc {rc}" if rc is not None else what
    line = f"round {i + 1} {kind}: {what if rc is not None else 'SIGKILL during a save'}; {ended}"
    return line + f"; said: {said[0][:160] if said else '(nothing)'}", problems


def fault_loop(rounds: int, steps: int, seed: int, workdir: Path) -> tuple[list[str], str]:
    """Run the loop: ``(problems found, the faults' counts)``."""
    rng = random.Random(seed)
    ref, length = crashlib.reference(workdir, steps, EVERY)
    print(f"reference: {steps} steps in {length:.1f}s", flush=True)
    ckpt, metrics = workdir / "ck", workdir / "damaged.jsonl"
    problems: list[str] = []
    counts = dict.fromkeys(FAULTS, 0)
    for i in range(rounds):
        on_disk = _steps(ckpt)
        kind = rng.choice(FAULTS if on_disk else ("full-disk", "sigkill"))  # nothing to damage
        if kind in ("full-disk", "sigkill") and on_disk and on_disk[-1] >= steps:
            shutil.rmtree(ckpt / str(on_disk[-1]))  # the training is done: rewind one save
        counts[kind] += 1
        line, found = one_round(i, kind, ckpt, metrics, workdir, steps, rng)
        problems += found
        print(line, flush=True)
    done = subprocess.run(
        crashlib.command(steps, ckpt, metrics, EVERY),
        env=crashlib.env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 or "Traceback" in done.stderr:
        problems.append(f"the final run exited {done.returncode}: {done.stderr[-300:]}")
    got = crashlib.losses(metrics)
    if got != ref:
        diff = [s for s in ref if got.get(s) != ref[s]]
        problems.append(f"losses differ from the undamaged run at steps {diff[:10]}")
    else:
        print(f"losses of all {len(ref)} steps equal the undamaged run's bit for bit", flush=True)
    return problems, ", ".join(f"{k} {n}" for k, n in counts.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fault-loop-") as tmp:
        problems, counts = fault_loop(args.rounds, args.steps, args.seed, Path(tmp))
    for line in problems:
        print(f"FAIL {line}")
    verdict = "ok: one line or none a round, no traceback, losses bit for bit"
    print(f"fault loop: {args.rounds} rounds (seed {args.seed}; {counts}): "
          f"{verdict if not problems else 'FAILED'}; took {time.monotonic() - t0:.0f}s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
