"""Validation runs once: a command-line run and ``train(cfg)`` each resolve their plan once, and
every rule runs once on the way, whatever imports it under whichever name.

The calls are counted by code object with a profile hook (``sys.setprofile`` and
``threading.setprofile``), so an alias (``from ... import check_parallel as cp``), a lazy import
inside a function or a method that forwards to a rule is counted as well; a test at the end shows
that the count catches a second validation.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from colossal_jax import cli
from colossal_jax.checks import preflight
from colossal_jax.checks import resolve as resolve_module
from colossal_jax.config import TrainConfig, model_rules, parallel_rules, train_rules
from colossal_jax.hf import checks as hf_checks
from colossal_jax.training import trainer
from colossal_jax.training.trainer import train

RULES: dict[str, Callable] = {
    "resolve": resolve_module.resolve,
    "check_parallel": parallel_rules.check_parallel,
    "check_train": train_rules.check_train,
    "hf_overrides": hf_checks.hf_overrides,
    "model_overrides": hf_checks.model_overrides,
    "size_model": resolve_module.size_model,
    "check_model": model_rules.check_model,
    "check_task": model_rules.check_task,
    "check_run": model_rules.check_run,
    "check_resume": preflight.check_resume,
    "check_memory": model_rules.check_memory,
}
"""The rule entry point and each rule it runs. ``check_field`` (a path probe, a data file read) is
counted per field: the command line checks its flags' files before anything else
(:func:`~colossal_jax.checks.resolve.check_files`) and the resolve reads those answers back."""

TINY = ["--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.n_head=2",
        "--batch-size", "8", "--seq-len", "16", "--steps", "1", "--eval-every", "0",
        "--no-progress"]  # fmt: skip


@contextmanager
def counted_calls() -> Iterator[Counter]:
    """The calls of :data:`RULES` (by name) and of ``check_field`` (as ``check_field:<field>``)
    made inside the block, in every thread."""
    names = {f.__code__: name for name, f in RULES.items()}
    field_check = preflight.check_field.__code__
    calls: Counter = Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in names:
            calls[names[code]] += 1
        elif code is field_check:
            calls[f"check_field:{frame.f_locals['name']}"] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.fixture(autouse=True)
def fresh_reads(monkeypatch):
    """No answer of an earlier test's resolve: each file is read and each path probed here."""
    monkeypatch.setattr(resolve_module, "_READS", {})


def _expected(*fields: str) -> Counter:
    """Every rule once, and ``check_field`` once per field given."""
    return Counter({**dict.fromkeys(RULES, 1), **{f"check_field:{f}": 1 for f in fields}})


def test_a_command_line_run_validates_once(tmp_path, capsys):
    ckpt, metrics = str(tmp_path / "ckpt"), str(tmp_path / "metrics.jsonl")
    argv = [*TINY, "--checkpoint-dir", ckpt, "--metrics-file", metrics]
    with counted_calls() as calls:
        assert cli.main(argv) == 0, capsys.readouterr().err
    assert calls == _expected("metrics_file", "checkpoint_dir", "data")


def test_train_validates_once(tmp_path):
    cfg = cli.config_from_args(cli.build_parser().parse_args(TINY), 8)
    cfg = dataclasses.replace(cfg, checkpoint_dir=str(tmp_path / "ckpt"))
    with counted_calls() as calls:
        train(cfg, progress=False, log=lambda _: None)
    assert calls == _expected("checkpoint_dir", "data")


def test_a_second_validation_is_caught(monkeypatch):
    """A ``build`` that validates its plan again (what the count is for) is seen: resolve and
    every rule twice."""
    build = trainer.build

    def build_and_validate_again(plan):
        resolve_module.resolve(plan.config, plan.devices)
        return build(plan)

    monkeypatch.setattr(trainer, "build", build_and_validate_again)
    cfg = cli.config_from_args(cli.build_parser().parse_args(TINY), 8)
    with counted_calls() as calls:
        train(cfg, progress=False, log=lambda _: None)
    assert calls != _expected("data")
    assert isinstance(cfg, TrainConfig)
    assert calls["resolve"] == calls["check_parallel"] == calls["check_run"] == 2
