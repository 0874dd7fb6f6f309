"""Rules of ``--init-from-hf DIR``: the directory holds a family our ``--model`` loads, options
our model computes alike and weights; its ``config.json`` sets the architecture, which
``--set model.*`` may add to but not contradict. JAX-free (reads ``config.json`` only).
"""

from __future__ import annotations

from typing import Any

from colossal_jax.config.errors import ConfigError
from colossal_jax.config.model_rules import _models
from colossal_jax.config.schema import TrainConfig

# ---- initialisation from a Hugging Face directory -----------------------------------------------


def hf_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The model fields the ``config.json`` of ``--init-from-hf DIR`` sets ({} without it), once
    the directory passes :func:`check_hf_directory`."""
    if cfg.init_from_hf is None:
        return {}
    family, config = check_hf_directory(cfg.init_from_hf, cfg.model)
    try:
        return family.overrides(config)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--init-from-hf {cfg.init_from_hf}: {e}") from None


def check_hf_directory(directory: str, model: str) -> tuple[Any, dict[str, Any]]:
    """``(family module, config.json)`` of a Hugging Face directory that our model ``model``
    (``--model``) can load: a mapped ``model_type`` of ``model``'s family, every option our
    model computes alike (``SUPPORTED`` of the family), and a weight file."""
    from pathlib import Path

    from colossal_jax import hf

    flag = f"--init-from-hf {directory}"
    config = hf.read_config(directory)
    model_type = config.get("model_type")
    if model_type not in hf.FAMILIES:
        raise ConfigError(
            f"{flag} holds a {model_type!r} model (config.json model_type); the mapped families "
            f"are {', '.join(hf.FAMILIES)}"
        )
    family = hf.family(model_type)
    models = _models()
    base = models.get(model)
    if base is not None and type(base).__name__ != family.CONFIG_CLASS:
        same = [n for n, m in models.items() if type(m).__name__ == family.CONFIG_CLASS]
        raise ConfigError(
            f"{flag} holds a {model_type} model but --model {model} is a "
            f"{type(base).__name__}; use a --model of that family"
            + (f", e.g. --model {same[0]} (the sizes come from the directory)" if same else "")
        )
    for key, (allowed, default) in family.SUPPORTED.items():
        value = config.get(key, default)
        if value not in allowed:
            raise ConfigError(
                f"{flag}: config.json has {key}={value!r}, which our model does not compute; "
                f"it supports {' or '.join(repr(a) for a in allowed)}"
            )
    if not any((Path(directory) / name).is_file() for name in hf.WEIGHT_FILES):
        raise ConfigError(
            f"{flag} has config.json but no weights (none of {', '.join(hf.WEIGHT_FILES)}); "
            "save the model with save_pretrained"
        )
    return family, config


def model_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The model fields of the run: the architecture of ``--init-from-hf`` (if given) with
    ``--set model.*`` on top, which may add to it but not contradict it."""
    from_hf = hf_overrides(cfg)
    for key, value in cfg.model_overrides.items():
        if key in from_hf and from_hf[key] != value:
            raise ConfigError(
                f"--set model.{key}={value} contradicts --init-from-hf {cfg.init_from_hf}, whose "
                f"config.json gives {key}={from_hf[key]}; drop --set model.{key} (the directory "
                "sets the architecture)"
            )
    return {**from_hf, **cfg.model_overrides}


def check_init_from_hf(cfg: TrainConfig) -> None:
    """``--init-from-hf DIR``: a directory our ``--model``'s family loads, whose architecture
    ``--set model.*`` does not contradict (:func:`model_overrides`)."""
    if cfg.init_from_hf is not None:
        model_overrides(cfg)
