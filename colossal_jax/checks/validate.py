"""The run-level entry point of the device-free rules: the config, a Hugging Face directory's
architecture, and the resolved model config (:func:`check_config`, :func:`resolve_model`)."""

from __future__ import annotations

from typing import Any

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.model_rules import check_with_model
from colossal_jax.config.parallel_rules import check_parallel
from colossal_jax.config.schema import TrainConfig
from colossal_jax.config.train_rules import check_train
from colossal_jax.hf.checks import check_init_from_hf, model_overrides


def check_config(
    cfg: TrainConfig,
    model: Any = None,
    n_devices: int | None = None,
    memory: tuple[int, int] | None = None,
) -> None:
    """Every device-free rule of ``cfg``: the parallel config (against ``n_devices`` when
    given), the training and optimizer fields and, with a resolved ``model`` (any family's
    config), the model, task and run rules; with ``memory = (capacity bytes, devices sharing
    it)`` also the training-state floor."""
    check_parallel(cfg.parallel, n_devices)
    check_train(cfg)
    check_init_from_hf(cfg)
    if model is not None:
        check_with_model(cfg, model, memory)


def resolve_model(cfg: TrainConfig, data_vocab: int | None) -> Any:
    """The model config (of any family, :mod:`colossal_jax_models.registry`): the named one, the
    architecture of ``--init-from-hf`` (if given) or else the vocabulary its task needs for data
    of ``data_vocab`` token ids (:func:`colossal_jax.data.tasks.model_vocab`), then ``--set
    model.*``; an unknown name or field is a ConfigError."""
    return size_model(cfg, model_overrides(cfg), data_vocab)


def size_model(cfg: TrainConfig, overrides: dict[str, Any], data_vocab: int | None) -> Any:
    """:func:`resolve_model` for the run's model fields ``overrides`` already read
    (:func:`colossal_jax.hf.checks.model_overrides`: ``--init-from-hf`` and ``--set model.*``)."""
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
