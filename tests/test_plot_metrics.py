"""scripts/plot_metrics.py: a real PNG from two synthetic runs; bad inputs exit 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "plot_metrics.py"


def write_run(path: Path, steps: int, *, tps: float, with_eval: bool = False) -> Path:
    lines = []
    for step in range(1, steps + 1):
        rec = {
            "step": step,
            "loss": 5.0 / step**0.5,
            "lr": 1e-3 * min(1.0, step / 3),
            "grad_norm": 1.0 / step,
            "step_time_s": 0.1,
            "tokens_per_s": tps * (1 + 0.05 * (step % 3)),
            "mfu": None,
        }
        if with_eval:
            rec["peak_bytes_in_use"] = (100 + 10 * step) * 2**20
            if step % 2 == 0:
                rec["eval_loss"] = 5.2 / step**0.5
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def run_script(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a = write_run(tmp_path / "data8.jsonl", 6, tps=4000.0, with_eval=True)
    b = write_run(tmp_path / "tensor8.jsonl", 6, tps=2500.0)
    return a, b


def test_two_runs_make_a_non_blank_png(two_runs, tmp_path):
    out = tmp_path / "runs.png"
    proc = run_script(*two_runs, "--png", out, "--labels", "data=8,tensor=8")
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and proc.stderr == ""
    img = imread(out)
    height, width = img.shape[:2]
    assert width >= 600 and height >= 400, img.shape
    rgb = img[..., :3]
    assert rgb.std() > 0.05, rgb.std()
    colours = np.unique((rgb * 255).round().astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20, len(colours)


def test_bad_inputs_exit_2_with_one_error_line(two_runs, tmp_path):
    a, _ = two_runs
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('not json\n{"loss": 1.0}\n[1, 2]\n')
    cases = [
        ((tmp_path / "missing.jsonl", "--png", tmp_path / "x.png"), "missing.jsonl"),
        ((garbage, "--png", tmp_path / "x.png"), "garbage.jsonl"),
        ((a, "--png", tmp_path), str(tmp_path)),  # a directory
        ((a, "--png", a / "x.png"), "x.png"),  # under a regular file
        ((a, "--png", tmp_path / "x.png", "--labels", "p,q"), "--labels"),
    ]
    for args, needle in cases:
        proc = run_script(*args)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], (args, err)
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()
