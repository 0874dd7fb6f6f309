"""The run's model config sized for its task's data (:func:`size_model`), for
:func:`colossal_jax.checks.resolve.resolve`."""

from __future__ import annotations

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
