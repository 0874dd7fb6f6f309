"""The large-batch experiment (scripts/large_batch.py): its arms see the same samples with the
LAMB paper's rule, and ``--quick`` runs end to end, writing the table and the plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colossal_jax.checks.resolve import resolve
from colossal_jax_benchmarks import large_batch as lb

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("task", lb.TASKS["full"], ids=lambda t: t.model)
def test_arms_see_the_same_samples_with_the_sqrt_rule(task):
    base = resolve(lb.run_config(task, lb.arm("AdamW@B"), 0), 1).config
    for label in task.arms[1:]:
        a = lb.arm(label)
        big = resolve(lb.run_config(task, a, 0), 1).config
        assert big.steps * big.batch_size == base.steps * base.batch_size == task.samples
        assert big.steps * lb.MULTIPLE == base.steps
        assert big.eval_every * lb.MULTIPLE == base.eval_every  # evaluations at equal samples
        assert big.optim.warmup_steps == base.optim.warmup_steps  # linear-epoch warm-up
        if a.optimizer == "adamw":
            assert big.optim.lr == pytest.approx(4 * base.optim.lr)  # √16
    data = {"bert-tiny": "stdlib", "vit-tiny": "digits"}[task.model]
    assert base.data == data  # real data that ships with the dependencies


@pytest.mark.slow
def test_quick_mode_writes_the_table_and_the_plot(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's run
    cmd = [sys.executable, str(ROOT / "scripts" / "large_batch.py"), "--quick", "--seeds", "1"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "large_batch_quick.json").read_text())
    assert (tmp_path / "img" / "large_batch_quick.png").stat().st_size > 10_000
    for model, arms in (("bert-tiny", 3), ("vit-tiny", 4)):
        entry = results["tasks"][model]
        assert len(entry["table"]) == arms and entry["verdict"]["steps_ratio"] == 1 / 16
        metric = entry["task"]["metric"]
        for run in entry["runs"]:
            assert len(run["samples"]) == len(run[metric]) == lb.EVALS + 1
    assert "LAMB@16B" in proc.stdout
