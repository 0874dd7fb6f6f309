"""Two processes on loopback (gloo CPU collectives) train like one process with the same mesh."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers import script_env

ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "--steps",
    "6",
    "--batch-size",
    "8",
    "--seq-len",
    "32",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_embd=64",
    "--mesh",
    "data=4",
    "--zero",
    "1",
    "--no-progress",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    script = str(ROOT / "scripts" / "train.py")
    one = tmp_path / "one.jsonl"
    subprocess.run(
        [sys.executable, script, "--devices", "4", *ARGS, "--metrics-file", str(one)],
        check=True,
        env=script_env(),
        capture_output=True,
        timeout=300,
    )
    port = _free_port()
    two = tmp_path / "two.jsonl"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                script,
                "--devices",
                "2",
                *ARGS,
                "--metrics-file",
                str(two),
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],
            env=script_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    a = [r["loss"] for x in one.read_text().splitlines() if "loss" in (r := json.loads(x))]
    b = [r["loss"] for x in two.read_text().splitlines() if "loss" in (r := json.loads(x))]
    np.testing.assert_allclose(b, a, rtol=1e-5)
