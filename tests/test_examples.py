"""Each script in examples/ runs as a fresh process and prints what it promises."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # XLA_FLAGS from conftest: 8 devices already
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _float(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return float(m.group(1))


@pytest.mark.slow
def test_train_from_python():
    out = run_example("train_from_python.py")
    assert "losses:" in out
    first = _float(r"eval losses: step 0: ([\d.]+)", out)
    final = _float(r"final eval loss: ([\d.]+)", out)
    assert final < 0.8 * first


@pytest.mark.slow
def test_restore_and_evaluate():
    out = run_example("restore_and_evaluate.py")
    trained = _float(r"trained: step 20, eval loss ([\d.]+)", out)
    restored = _float(r"eval loss of the restored model: ([\d.]+)", out)
    untrained = _float(r"eval loss of a fresh \(untrained\) model: ([\d.]+)", out)
    assert restored == pytest.approx(trained, rel=1e-4)
    assert restored < untrained
    assert "restored step 20 onto mesh data=2,tensor_row=4" in out


@pytest.mark.slow
def test_compare_meshes():
    out = run_example("compare_meshes.py")
    rows = [line.split() for line in out.splitlines() if re.match(r"^(data|tensor|pipe)=", line)]
    rows = [r for r in rows if len(r) >= 4 and r[-3].replace(".", "").isdigit()]
    assert len(rows) == 4, out
    losses = [float(r[-3]) for r in rows]
    assert max(losses) - min(losses) < 1e-2 * losses[0], losses
