"""A run killed with SIGKILL resumes from its last complete checkpoint and reproduces, bit for
bit, the per-step losses of an uninterrupted run (same command, same mesh)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import script_env

ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "--devices",
    "4",
    "--mesh",
    "data=4",
    "--steps",
    "12",
    "--batch-size",
    "8",
    "--seq-len",
    "32",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_embd=64",
    "--checkpoint-every",
    "2",
    "--eval-every",
    "0",
    "--no-progress",
]


def _cmd(ckpt: Path, metrics: Path) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *ARGS,
        "--checkpoint-dir",
        str(ckpt),
        "--metrics-file",
        str(metrics),
    ]


def _losses(path: Path) -> list[tuple[int, float]]:
    records = map(json.loads, path.read_text().splitlines())
    return [(r["step"], r["loss"]) for r in records if "loss" in r]  # not eval-only records


def test_sigkill_and_resume_reproduce_losses_bitwise(tmp_path):
    full_metrics = tmp_path / "full.jsonl"
    subprocess.run(
        _cmd(tmp_path / "full", full_metrics),
        check=True,
        env=script_env(),
        capture_output=True,
        timeout=300,
    )

    metrics = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        _cmd(tmp_path / "ck", metrics),
        env=script_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines())
    assert 0 < killed_at < 12, "killed mid-way"

    out = subprocess.run(
        _cmd(tmp_path / "ck", metrics),
        check=True,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "resumed from" in out.stdout
    assert _losses(metrics) == _losses(full_metrics)  # exact float equality
