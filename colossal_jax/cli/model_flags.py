"""The model flags the planner's scripts share (``scripts/sweep_meshes.py``,
``scripts/profile_step.py``): the model size, its field overrides, the batch and the sequence
length. ``scripts/train.py`` generates its own from the config (:mod:`colossal_jax.cli.parser`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from colossal_jax.config import TrainConfig


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--set FIELD=VALUE`` (repeatable), ``--batch-size`` and ``--seq-len``."""
    p.add_argument("--model", default="gpt2-tiny", help="a model size (default gpt2-tiny)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a model field, e.g. --set n_layer=4 (repeatable)",
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)


def model_config(args: argparse.Namespace, precision: str) -> TrainConfig:
    """The :class:`TrainConfig` those flags and ``args.devices`` name, in ``precision``;
    raises :class:`~colossal_jax.config.ConfigError` for a model or field that does not exist."""
    from colossal_jax.cli.configure import model_overrides
    from colossal_jax.config import TrainConfig

    return TrainConfig(
        model=args.model,
        model_overrides=model_overrides(args.model, args.set),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        devices=args.devices,
        precision=precision,
    )
