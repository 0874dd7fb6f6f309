"""Resuming a checkpoint with arrays of other shapes is one ``error:`` line and exit status 2.

A run that resumes a ``--checkpoint-dir`` must have the same model shape, vocabulary (which
follows ``--data``), optimizer-state structure and loss scaling as the run that wrote it.
``preflight.check_resume`` compares them from the checkpoint's JSON metadata before JAX (the
command line) and at the start of ``train.train`` (the Python API); a misfit it cannot see is
caught by ``Checkpointer.restore``, which compares orbax's stored shapes with the run's before
reading any array. Every case must answer in under 20 s.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import numpy as np
import pytest

from colossal_jax import cli
from colossal_jax.config import ConfigError, OptimConfig
from colossal_jax.training.trainer import train
from tests.helpers import tiny_config

RUN = ["--steps", "4", "--batch-size", "8", "--seq-len", "32", "--eval-every", "0"]
TINY = ["--set", "model.n_layer=1"]
SMALL = ["--model", "gpt2-small", "--set", "model.n_layer=1", "--set", "model.n_embd=64"]
SMALL += ["--set", "model.n_head=4"]


def case(ckpt, extra, *expected):
    return pytest.param(ckpt, extra, expected, id=f"{ckpt}: {' '.join(extra)}")


# (checkpoint written with, flags of the resume, substrings of the one error line)
CASES = [
    case(
        "tiny", ["--model", "gpt2-small"], "--model gpt2-tiny, not gpt2-small", "--model gpt2-tiny"
    ),
    case("small", ["--model", "gpt2-tiny"], "--model gpt2-small, not gpt2-tiny"),
    case("tiny", ["--set", "model.n_embd=64"], "model.n_embd=128, not model.n_embd=64"),
    case("tiny", ["--set", "model.n_layer=2"], "model.n_layer=1, not model.n_layer=2"),
    case(
        "tiny",
        ["--data", "{ids300}"],
        "a vocabulary of 256 tokens (--data stdlib), not 300",
        "use --data stdlib",
    ),
    case(
        "small",
        ["--data", "synthetic"],
        "a vocabulary of 256 tokens (--data stdlib), not 50304 (--data synthetic)",
    ),
    case(
        "tiny", ["--set", "model.vocab_size=512"], "model.vocab_size=256, not model.vocab_size=512"
    ),
    case("tiny", ["--optimizer", "lamb"], "--optimizer adamw, not lamb", "use --optimizer adamw"),
    case("tiny", ["--optimizer", "sgd"], "--optimizer adamw, not sgd"),
    case("tiny", ["--optimizer", "lars"], "--optimizer adamw, not lars"),
    case("tiny", ["--clip-norm", "0"], "--clip-norm 1.0, not 0.0"),
    case("tiny", ["--precision", "fp16"], "--precision fp32, not fp16", "use --precision fp32"),
    case("tiny", ["--seed", "3"], "--seed 0, not 3"),
    case("sgd", ["--set", "optim.b1=0"], "--set optim.b1=0.9, not 0.0"),
]

WRITERS = {
    "tiny": TINY,
    "small": SMALL,
    "sgd": TINY + ["--optimizer", "sgd"],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One 2-step checkpoint per writer of ``WRITERS`` (made on first use), and the data files."""
    root = tmp_path_factory.mktemp("mismatch")
    np.save(root / "ids300.npy", np.arange(5000) % 300)
    made: dict[str, str] = {"ids300": str(root / "ids300.npy")}

    def get(name: str) -> str:
        if name not in made:
            path = root / name
            argv = WRITERS[name] + RUN + ["--steps", "2", "--checkpoint-dir", str(path)]
            assert cli.main(argv + ["--no-progress"]) == 0
            made[name] = str(path)
        return made[name]

    return get, made


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith("error: ") and "Traceback" not in err, lines[0]
    return lines[0]


@pytest.mark.parametrize("ckpt,extra,expected", CASES)
def test_resume_mismatch_is_one_line(ckpt, extra, expected, checkpoints, capsys):
    get, made = checkpoints
    path = get(ckpt)
    capsys.readouterr()
    base = WRITERS[ckpt] if extra[0] != "--model" else []
    argv = [x.format(**made) for x in base + RUN + extra + ["--checkpoint-dir", path]]
    t0 = time.perf_counter()
    assert cli.main(argv + ["--no-progress"]) == 2
    seconds = time.perf_counter() - t0
    line = _one_error_line(capsys.readouterr().err)
    for want in expected:
        assert want in line, line
    assert f"--checkpoint-dir {path} holds step 2" in line
    assert seconds < 20, seconds


def _api_config(path: str, **changes):
    cfg = dataclasses.replace(
        tiny_config(steps=4, batch_size=8, devices=8, data=8),
        model_overrides={"n_layer": 1},
        optim=OptimConfig(),
        eval_every=0,
        checkpoint_dir=path,
    )
    return dataclasses.replace(cfg, **changes)


@pytest.mark.parametrize(
    "changes,expected",
    [
        (dict(model="gpt2-small"), "--model gpt2-tiny, not gpt2-small"),
        (dict(model_overrides={"n_layer": 1, "n_embd": 64}), "model.n_embd=128, not"),
        (dict(data="{ids300}"), "a vocabulary of 256 tokens"),
        (dict(optim=OptimConfig(name="lamb")), "--optimizer adamw, not lamb"),
        (dict(precision="fp16"), "--precision fp32, not fp16"),
    ],
    ids=["model", "n_embd", "vocab", "optimizer", "fp16"],
)
def test_python_api_refuses_the_same(changes, expected, checkpoints):
    """``train(cfg)`` does not go through ``cli.main``; it runs the same check first."""
    get, made = checkpoints
    path = get("tiny")
    if "data" in changes:
        changes = {**changes, "data": changes["data"].format(**made)}
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="holds step 2") as info:
        train(_api_config(path, **changes), progress=False, log=lambda _: None)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert time.perf_counter() - t0 < 20


def test_restore_names_the_first_misfit_when_the_metadata_cannot_tell(checkpoints, tmp_path):
    """A checkpoint whose JSON says nothing usable (as if written by another tool): the restore
    itself compares orbax's stored shapes and names the first array that differs."""
    get, _ = checkpoints
    copy = tmp_path / "ckpt"
    shutil.copytree(get("tiny"), copy)
    meta = copy / "2" / "meta" / "metadata"
    meta.write_text(json.dumps({"step": 2}))
    cfg = _api_config(str(copy), model_overrides={"n_layer": 1, "n_embd": 64})
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        train(cfg, progress=False, log=lambda _: None)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert "with shape (" in message and "but this run expects (" in message, message
    assert "128" in message and "64" in message, message
    assert time.perf_counter() - t0 < 20
