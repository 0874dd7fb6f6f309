"""Ctrl-C and SIGTERM stop a run cleanly: exit 130/143 within 30 s with one line, a checkpoint
at the step reached, and a re-run that continues the exact loss sequence; at random moments no
run dies by a signal or prints a traceback; SIGKILL loops lose nothing (subprocesses, slow)."""

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
STEPS = 20


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return crashlib.reference(tmp_path_factory.mktemp("ref"), STEPS, 4)[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_run_saves_exits_and_resumes_exactly(tmp_path, reference, sig):
    ckpt, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    cmd = crashlib.command(STEPS, ckpt, metrics, 4)
    proc = subprocess.Popen(cmd, env=crashlib.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while crashlib.last_step(metrics) < 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
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
    assert 7 <= step < STEPS and Path(m.group(2)) == ckpt.resolve()
    assert (ckpt / str(step)).is_dir() and crashlib.last_step(metrics) == step
    out = subprocess.run(cmd, env=crashlib.env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"resumed from {ckpt.resolve()} at step {step}" in out.stdout
    assert crashlib.losses(metrics) == reference  # exact float equality


def test_sigint_at_random_moments_never_crashes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "signal_loop.py"), "--moments", "3", "--seed", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_kill_loop_loses_nothing():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kill_loop.py"), "--kills", "3", "--steps", "12"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bit for bit" in out.stdout
