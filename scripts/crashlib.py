"""What scripts/signal_loop.py, scripts/kill_loop.py and their tests share: the small run's
command, its environment, and reading the per-step losses of a metrics file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SMALL = [
    "--devices", "4", "--mesh", "data=4", "--set", "model.n_layer=1", "--set", "model.n_embd=64",
    "--batch-size", "8", "--seq-len", "32", "--no-progress",
]  # fmt: skip


def command(steps: int, ckpt: Path, metrics: Path, every: int, *extra: str) -> list[str]:
    """``scripts/train.py`` on the small run with checkpoints in ``ckpt`` every ``every``."""
    return [
        sys.executable, str(ROOT / "scripts" / "train.py"), *SMALL, "--steps", str(steps),
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(every),
        "--metrics-file", str(metrics), *extra,
    ]  # fmt: skip


def env() -> dict[str, str]:
    """CPU, no inherited XLA_FLAGS (``--devices`` sets the device count)."""
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    e.pop("XLA_FLAGS", None)
    return e


def losses(metrics: Path) -> dict[int, float]:
    """The loss of each step: the last record of the step (a resumed run repeats steps)."""
    out: dict[int, float] = {}
    if not metrics.exists():
        return out
    for line in metrics.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if "loss" in r:
            out[int(r["step"])] = r["loss"]
    return out


def last_step(metrics: Path) -> int:
    steps = losses(metrics)
    return max(steps) if steps else 0


def reference(workdir: Path, steps: int, every: int) -> tuple[dict[int, float], float]:
    """An uninterrupted run: its losses and its wall time."""
    metrics = workdir / "reference.jsonl"
    t0 = time.monotonic()
    subprocess.run(
        command(steps, workdir / "reference", metrics, every),
        env=env(), check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return losses(metrics), time.monotonic() - t0
