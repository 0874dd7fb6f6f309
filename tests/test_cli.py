"""The command line: impossible configurations exit 2 with one line naming the bad value."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colossal_jax.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "not_a_dir"
    f.write_text("x")
    return str(f)


BAD = [
    (["--mesh", "data=3"], "data=3"),
    (["--mesh", "dta=8"], "dta"),
    (["--mesh", "data=2,tensor_row=3"], "tensor_row=3"),
    (["--batch-size", "7", "--mesh", "data=8"], "--batch-size 7"),
    (["--model", "nosuch"], "nosuch"),
    (["--steps", "-1"], "--steps -1"),
    (
        ["--mesh", "data=2,tensor_row=4", "--tensor-mode", "1d", "--set", "model.n_head=6"],
        "n_head=6",
    ),
    (["--set", "model.nosuch=1"], "nosuch"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_configuration_exits_2_with_one_line(argv, needle, capsys):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_checkpoint_dir_that_is_a_file(a_file, capsys):
    assert main(["--checkpoint-dir", a_file, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and a_file in err[0]


@pytest.mark.quiet
def test_real_process_exits_2_quickly():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--mesh", "data=3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "data=3" in lines[0]
    assert time.time() - t0 < 20
