"""Ctrl-C and SIGTERM stop a run cleanly: exit 130/143 within 30 s with one line, a checkpoint
at the step reached, and a re-run that continues the exact loss sequence; at random moments no
run dies by a signal or prints a traceback; SIGKILL loops lose nothing (subprocesses, slow).

Every run here compiles at conftest's ``--xla_backend_optimization_level=0`` (about 2/3 of a
compile's CPU time), which ``crashlib.env`` passes on to the runs it starts, the loop scripts'
included. Losses are compared only between runs compiled alike."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import crashlib  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 24


def _script(name: str, *args: str) -> list[str]:
    """``python scripts/NAME ARGS`` (the runs it starts get ``crashlib.env()``)."""
    return [sys.executable, str(ROOT / "scripts" / name), *args]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ref")
    cmd = crashlib.command(STEPS, workdir / "ck", workdir / "m.jsonl", 4)
    subprocess.run(cmd, env=crashlib.env(), check=True, capture_output=True, timeout=600)
    return crashlib.losses(workdir / "m.jsonl")


def _interrupt(cmd, metrics: Path, sig: signal.Signals, at: int, ckpt: Path) -> tuple[int, str]:
    """Run ``cmd``, send ``sig`` once step ``at`` is logged: the step it stopped at (checked:
    exit status, latency, one line, the checkpoint) and its standard output."""
    proc = subprocess.Popen(cmd, env=crashlib.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while crashlib.last_step(metrics) < at and time.monotonic() < deadline:
        time.sleep(0.02)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    latency = time.monotonic() - sent
    assert proc.returncode == 128 + int(sig)
    assert latency < 30
    lines = err.decode().strip().splitlines()
    assert "Traceback" not in err.decode()
    m = re.fullmatch(
        r"interrupted(?: by SIGTERM)? at step (\d+); checkpoint saved in (.+) \(re-run the same "
        r"command to resume\)",
        lines[-1],
    )
    assert m, lines
    step = int(m.group(1))
    assert at <= step < STEPS and Path(m.group(2)) == ckpt.resolve()
    assert (ckpt / str(step)).is_dir() and crashlib.last_step(metrics) == step
    return step, out.decode()


def test_signal_mid_run_saves_exits_and_resumes_exactly(tmp_path, reference):
    """SIGINT at step 7 or later, then SIGTERM to the re-run 4 steps after where it resumed
    (each: its status, one line, its checkpoint), then a re-run to the end: the losses of every
    step are the uninterrupted run's, bit for bit. One chain of three runs checks both signals
    and a resumed run's interruption."""
    ckpt, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    cmd = crashlib.command(STEPS, ckpt, metrics, 4)
    first, _ = _interrupt(cmd, metrics, signal.SIGINT, 7, ckpt)
    second, out = _interrupt(cmd, metrics, signal.SIGTERM, first + 4, ckpt)
    assert f"resumed from {ckpt.resolve()} at step {first}" in out
    out = subprocess.run(cmd, env=crashlib.env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"resumed from {ckpt.resolve()} at step {second}" in out.stdout
    assert crashlib.losses(metrics) == reference  # exact float equality


def test_sigint_at_random_moments_never_crashes():
    # seed 1's moments: 13% and 85% of an uninterrupted run (its three were 13%, 76%, 85%: the
    # same phases, start-up and the training's end)
    out = subprocess.run(
        _script("signal_loop.py", "--moments", "2", "--seed", "1"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2/2 clean" in out.stdout, out.stdout


def test_kill_loop_loses_nothing():
    out = subprocess.run(
        _script("kill_loop.py", "--kills", "3", "--steps", "12"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bit for bit" in out.stdout
