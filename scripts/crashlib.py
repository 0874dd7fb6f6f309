"""What scripts/signal_loop.py, scripts/kill_loop.py, scripts/fault_loop.py and their tests
share: the small run's command, its environment, reading the per-step losses of a metrics file,
and a full disk made on purpose (:func:`full_disk_from`, :func:`full_disk_command`)."""

from __future__ import annotations

import errno
import json
import os
import re
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


KEPT_XLA_FLAGS = ("--xla_backend_optimization_level=",)
"""Inherited ``XLA_FLAGS`` that the runs keep: how hard XLA optimises (the test suite compiles
at level 0), not the device count, which ``--devices`` sets."""


def env() -> dict[str, str]:
    """CPU, of the inherited XLA_FLAGS only :data:`KEPT_XLA_FLAGS` (``--devices`` sets the
    device count); this checkout first on the import path (an inherited PYTHONPATH after it)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    flags = e.pop("XLA_FLAGS", "").split()
    kept = [f for f in flags if f.startswith(KEPT_XLA_FLAGS)]
    if kept:
        e["XLA_FLAGS"] = " ".join(kept)
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


def full_disk_from(step: int) -> None:
    """In this process, every array write of a checkpoint of ``step`` or later fails with
    ``ENOSPC`` inside orbax's writer threads, as on a full disk (a test's fault, where a small
    tmpfs needs root): orbax's serializer of a host array to tensorstore is wrapped."""
    from orbax.checkpoint._src.serialization import serialization

    real = serialization.async_serialize_from_host

    async def write(rslices, tensorstore_spec, *args, **kwargs):
        m = re.search(r"/(\d+)\.orbax-checkpoint-tmp", json.dumps(tensorstore_spec, default=str))
        if m and int(m.group(1)) >= step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), m.group(0))
        return await real(rslices, tensorstore_spec, *args, **kwargs)

    serialization.async_serialize_from_host = write


def full_disk_command(cmd: list[str], step: int) -> list[str]:
    """``cmd`` (a :func:`command`) run with the disk full from checkpoint ``step`` on."""
    child = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); import crashlib; "
        "crashlib.full_disk_from(int(sys.argv.pop(1))); sys.argv[0] = sys.argv.pop(1); "
        "from colossal_jax.cli import run; run()"
    )
    return [cmd[0], "-c", child, str(ROOT / "scripts"), str(step), *cmd[1:]]
