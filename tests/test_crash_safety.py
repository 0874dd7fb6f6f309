"""Failures lose no data: a diverged run stops before saving, a damaged latest checkpoint is
skipped for the one before it, and the rules and messages of both (in-process, fast)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from colossal_jax.cli import main
from colossal_jax.config import ConfigError
from colossal_jax.config.train_rules import check_keep_checkpoints
from colossal_jax.runtime import signals
from colossal_jax.runtime.divergence import MAX_SKIPPED_IN_A_ROW, Diverged, Guard, stop_line
from colossal_jax.training.run import build, restore
from colossal_jax.training.trainer import train
from tests.helpers import tiny_config

SMALL = [  # in-process: the 8 devices of conftest
    "--mesh", "data=8", "--set", "model.n_layer=1", "--set",
    "model.n_embd=64", "--batch-size", "8", "--seq-len", "32", "--no-progress",
]  # fmt: skip


def _quiet(cfg):
    return train(cfg, progress=False, log=lambda _: None)


def test_guard_fp32_stops_at_the_first_non_finite_value():
    g = Guard()
    assert g.check(5.0, 1.0) is None
    assert g.check(float("nan"), 1.0) == "loss is nan"
    assert g.check(5.0, float("inf")).startswith("gradient norm is inf")


def test_guard_fp16_skipped_steps_go_on_until_too_many_in_a_row():
    g = Guard(skipped=0)
    assert g.check(float("inf"), float("nan"), skipped_total=1) is None  # skipped: fine
    assert g.check(5.0, 1.0, skipped_total=1) is None  # a clean step resets the count
    for i in range(2, MAX_SKIPPED_IN_A_ROW + 1):
        assert g.check(float("nan"), float("nan"), skipped_total=i) is None
    assert "in a row were skipped" in g.check(float("nan"), 1.0, MAX_SKIPPED_IN_A_ROW + 1)
    # a step that was not skipped but whose loss is not finite stops at once
    assert Guard(skipped=3).check(float("nan"), 1.0, skipped_total=3) == "loss is nan"


def test_stop_line_names_the_step_and_the_last_good_checkpoint():
    line = stop_line("loss is nan", 7, "/ck", 6)
    assert line == (
        "loss is nan at step 7; stopped without saving; the last good checkpoint is step 6 in /ck"
    )
    assert "no checkpoint yet" in stop_line("loss is nan", 1, "/ck", None)
    assert "nothing was saved" in stop_line("loss is nan", 1, None, None)


def test_keep_checkpoints_must_be_positive():
    check_keep_checkpoints(1)
    with pytest.raises(ConfigError, match="--keep-checkpoints 0 must be at least 1"):
        check_keep_checkpoints(0)


def test_keep_checkpoints_0_on_the_command_line_exits_2(capsys):
    assert main(["--keep-checkpoints", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --keep-checkpoints 0")


def test_signal_exit_codes():
    assert signals.exit_code(signals.signal.SIGINT) == 130
    assert signals.exit_code(signals.signal.SIGTERM) == 143


def test_divergence_exits_3_and_keeps_only_finite_checkpoints(tmp_path, capsys):
    ckpt, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    argv = SMALL + ["--steps", "30", "--lr", "1e4", "--checkpoint-every", "2", "--eval-every", "0"]
    argv += ["--checkpoint-dir", str(ckpt), "--metrics-file", str(metrics)]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    records = [json.loads(r) for r in metrics.read_text().splitlines()]
    first_bad = next(
        r["step"]
        for r in records
        if "loss" in r and not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]))
    )
    assert f"at step {first_bad}; stopped without saving" in err[0]
    assert err[0].startswith("error: ") and "the last good checkpoint is step" in err[0]
    saved = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    assert saved and saved[-1] < first_bad
    assert f"is step {saved[-1]} in {ckpt}" in err[0]
    # the latest checkpoint holds finite parameters and optimizer state
    cfg = tiny_config(steps=30, devices=8, data=8)
    cfg = dataclasses.replace(cfg, model_overrides={"n_layer": 1, "n_embd": 64})
    params, opt_state, step = restore(build(cfg), str(ckpt))
    assert step == saved[-1]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves((params, opt_state)))


def test_divergence_raises_in_the_api(tmp_path):
    cfg = dataclasses.replace(
        tiny_config(steps=30, devices=4, data=4), checkpoint_dir=None, eval_every=0
    )
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=1e4))
    with pytest.raises(Diverged) as e:
        _quiet(cfg)
    assert "nothing was saved" in e.value.line


def _truncate_largest(step_dir: Path) -> Path:
    data = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    victim = max(data, key=lambda p: p.stat().st_size)
    with victim.open("r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    return victim


@pytest.fixture(scope="module")
def saved_to_6(tmp_path_factory):
    """One uninterrupted run with checkpoints at steps 2, 4 and 6 (no held-out loss: not what
    is checked here), its losses and folder; each case damages a copy."""
    path = tmp_path_factory.mktemp("saved_to_6")
    cfg = dataclasses.replace(
        tiny_config(steps=6, devices=8, data=8), eval_every=0, checkpoint_every=2
    )
    return cfg, _quiet(dataclasses.replace(cfg, checkpoint_dir=str(path))).losses, path


@pytest.mark.parametrize("damage", ["truncate", "metadata"])
def test_a_damaged_latest_checkpoint_is_skipped_with_a_warning(
    saved_to_6, tmp_path, capsys, damage
):
    base, full, saved = saved_to_6
    tmp_path = tmp_path / "ck"
    shutil.copytree(saved, tmp_path)
    cfg = dataclasses.replace(base, checkpoint_dir=str(tmp_path))
    if damage == "truncate":
        _truncate_largest(tmp_path / "6")
    else:
        (tmp_path / "6" / "meta" / "metadata").unlink()
    capsys.readouterr()
    resumed = _quiet(cfg)
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1, warning
    assert warning[0].startswith(f"warning: checkpoint step 6 in {tmp_path} is incomplete or ")
    assert warning[0].endswith("using step 4")
    assert resumed.start_step == 4
    assert resumed.losses == full[4:6]
    assert (tmp_path / "6.corrupt").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["2", "4", "6"]
