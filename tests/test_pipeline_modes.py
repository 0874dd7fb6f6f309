"""The pipeline composed with the other modes inside a stage (tensor 1D/2D/3D, ring, Ulysses,
ZeRO-1, interleaved with 1D): the fp32 loss curve of ``--mesh data=8`` to 1e-4 (``STEPS`` steps,
``tests/test_pipeline.py``). In a file of its own so the two test workers share the pipeline's
tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import losses, script_env
from tests.test_pipeline import MODEL, ROOT, STEPS, _cfg


@pytest.fixture(scope="module")
def data_parallel_losses():
    return losses(_cfg(data=8))


COMPOSED = {
    "1d": dict(pipe=2, data=2, tensor_row=2, tensor_mode="1d"),
    "2d": dict(pipe=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "ring": dict(pipe=2, seq=2, data=2, seq_mode="ring"),
    "ulysses": dict(pipe=2, seq=2, data=2, seq_mode="ulysses"),
    "zero1": dict(pipe=2, data=4, zero=1),
    "interleaved-1d": dict(
        pipe=2, data=2, tensor_row=2, tensor_mode="1d", pipeline="interleaved", virtual_stages=2
    ),
}


# ZeRO-1 in a pipeline and interleaved 1D run in the default suite elsewhere
# (tests/test_zero.py's compositions, tests/test_pipeline.py's one-step gradients); here with
# -m exhaustive
ELSEWHERE = ("zero1", "interleaved-1d")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [n if n not in ELSEWHERE else pytest.param(n, marks=pytest.mark.exhaustive) for n in COMPOSED],
)
def test_modes_compose_inside_a_stage(name, data_parallel_losses):
    parallel = dict(COMPOSED[name])
    parallel.setdefault("pipeline", "1f1b")
    got = losses(_cfg(**parallel))
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)


def _cli_losses(tmp_path: Path, name: str, *flags: str) -> list[float]:
    """The training losses of ``scripts/train.py`` run with ``_cfg``'s settings and ``flags``
    (no held-out evaluation, whose compile the comparison does not need)."""
    out = tmp_path / f"{name}.jsonl"
    argv = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        "--steps",
        str(STEPS),
        "--batch-size",
        "32",
        "--seq-len",
        "32",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "3",
        "--eval-every",
        "0",
        "--no-progress",
        "--metrics-file",
        str(out),
    ]
    argv += [f"--set=model.{k}={v}" for k, v in MODEL.items()]
    env = script_env()
    proc = subprocess.run(argv + list(flags), capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]  # step 0: eval_loss only


@pytest.mark.slow
def test_3d_on_sixteen_devices_composes_with_the_pipeline(tmp_path, data_parallel_losses):
    """16 devices need a process of their own; the script's run is ``_cfg``'s, so its curve is
    compared with the in-process ``data=8`` one (the script's own ``data=8`` run gives it)."""
    got = _cli_losses(
        tmp_path, "p3d", "--devices", "16", "--mesh", "pipe=2,tensor=8", "--tensor-mode", "3d"
    )
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)
