"""The rules of :func:`colossal_jax.checks.resolve.resolve` that read the host: the run's model
config sized for its task's data (:func:`size_model`), the batch sized for the host's memory
(:func:`check_host_batch`) and a metrics file a new run would overwrite
(:func:`check_metrics_file`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.schema import TrainConfig


def size_model(cfg: TrainConfig, overrides: dict[str, Any], data_vocab: int | None) -> Any:
    """The model config (of any family, :mod:`colossal_jax.config.families`): the named one
    with the run's model fields ``overrides`` already read (:func:`colossal_jax.hf.checks.
    model_overrides`: the architecture of ``--init-from-hf``, then ``--set model.*``), else the
    vocabulary its task needs for data of ``data_vocab`` token ids
    (:func:`colossal_jax.data.tasks.model_vocab`). An unknown name or field, or data whose
    tokens exceed an ``--init-from-hf`` vocabulary, is a ConfigError."""
    from colossal_jax.config.families import model_config, task_of
    from colossal_jax.data.tasks import model_vocab

    overrides = dict(overrides)
    if cfg.init_from_hf is not None and data_vocab is not None and "vocab_size" in overrides:
        if data_vocab > overrides["vocab_size"]:
            raise ConfigError(
                f"--data {cfg.data} has token ids up to {data_vocab - 1}, but the model of "
                f"--init-from-hf {cfg.init_from_hf} has a vocabulary of "
                f"{overrides['vocab_size']}; use data tokenized for that model"
            )
    try:
        vocab = model_vocab(task_of(cfg.model), data_vocab)
        if vocab is not None and "vocab_size" not in overrides:
            overrides["vocab_size"] = vocab
        return model_config(cfg.model, **overrides)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set model.*: {e}") from None


BATCH_BYTES_PER_TOKEN = 16
"""Host bytes of one token position of a batch, at least: ``tokens``, ``targets``,
``positions`` and ``weights``, 4 bytes each (:func:`colossal_jax.data.batch.sequence_batch`;
image tokens carry more)."""


def host_memory_bytes() -> int | None:
    """The host's memory: its physical pages, or a smaller cgroup (v2) limit; None where the
    system does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def check_host_batch(cfg: TrainConfig, memory: int | None) -> None:
    """Refuse a batch that cannot fit the host's ``memory`` bytes: a batch is built on the host
    (and the next one beside it) before it is placed on the devices, so one batch of
    ``--batch-size × --seq-len`` positions, :data:`BATCH_BYTES_PER_TOKEN` bytes each, must fit
    in half of it. Checked before anything is allocated; ``memory`` None skips the rule."""
    need = cfg.batch_size * cfg.seq_len * BATCH_BYTES_PER_TOKEN
    if memory is None or 2 * need <= memory:
        return
    fits = memory // (2 * cfg.seq_len * BATCH_BYTES_PER_TOKEN)
    hint = f"--batch-size {fits} or fewer" if fits else "a shorter --seq-len"
    raise ConfigError(
        f"--batch-size {cfg.batch_size} × --seq-len {cfg.seq_len} makes one batch of "
        f"{_size(need)} on the host (and the next one beside it), but the host has "
        f"{_size(memory)} of memory; use {hint} (e.g. --batch-size 16)"
    )


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def check_metrics_file(cfg: TrainConfig, resumes: bool) -> None:
    """A new run (``resumes`` False) does not replace the records of an earlier run: a
    ``--metrics-file`` that holds any is refused unless ``--overwrite-metrics on``, or unless
    ``--checkpoint-dir`` exists and holds something (the same run, killed before its first
    checkpoint; its records are recomputed). A resumed run appends (:class:`colossal_jax.
    runtime.metrics.MetricsWriter` keeps the records up to the step it resumes from)."""
    path = cfg.metrics_file
    if path is None or resumes or cfg.overwrite_metrics:
        return
    try:
        holds = Path(path).stat().st_size > 0
    except OSError:
        return
    ckpt = cfg.checkpoint_dir
    if not holds or (ckpt is not None and Path(ckpt).is_dir() and any(Path(ckpt).iterdir())):
        return
    raise ConfigError(
        f"--metrics-file {path} holds the records of an earlier run and this run starts anew; "
        "give another --metrics-file, delete it, or pass --overwrite-metrics on to replace it"
    )
