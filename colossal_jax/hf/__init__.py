"""The Hugging Face bridge: load a ``save_pretrained`` directory into our model on any mesh, and
export our checkpoints back as one.

One small module per model family holds everything family-specific (:data:`FAMILIES`): the
Hugging Face ``model_type`` and architecture it maps, which of our config classes it maps to,
the HF config options our model computes alike, the translation of the config both ways, and the
parameter map (:mod:`colossal_jax.hf.mapping`). The rest is shared: reading and writing tensor
files (:mod:`colossal_jax.hf.tensors`), placing the tensors into a run's shardings
(:mod:`colossal_jax.hf.load`) and exporting a checkpoint (:mod:`colossal_jax.hf_export`).

This module and the family modules import no JAX (nor NumPy), so the configuration rules
(:func:`colossal_jax.hf.checks.check_init_from_hf`) read a directory's config before JAX starts.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from colossal_jax.config import ConfigError

FAMILIES: dict[str, str] = {
    "bert": "colossal_jax.hf.bert",
    "gpt2": "colossal_jax.hf.gpt2",
    "llama": "colossal_jax.hf.llama",
    "vit": "colossal_jax.hf.vit",
}
"""Hugging Face ``model_type`` -> the module that maps that family."""

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)
"""The weight files of a save_pretrained directory we read (the first found wins)."""


def family(model_type: str) -> ModuleType:
    """The family module of a Hugging Face ``model_type`` (KeyError if none)."""
    return importlib.import_module(FAMILIES[model_type])


def family_of(our_config: Any) -> ModuleType | None:
    """The family module that maps our model config class (a ``GPTConfig`` -> ``gpt2``)."""
    for model_type in FAMILIES:
        module = family(model_type)
        if type(our_config).__name__ == module.CONFIG_CLASS:
            return module
    return None


def read_config(directory: str | Path, flag: str = "--init-from-hf") -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face directory, or a one-line :class:`ConfigError`."""
    root = Path(directory)
    example = f"{flag} /path/to/save_pretrained_dir"
    if not root.is_dir():
        raise ConfigError(
            f"{flag} {directory} is not a directory; name a directory written by "
            f"save_pretrained (config.json and model.safetensors), e.g. {example}"
        )
    path = root / CONFIG
    try:
        config = json.loads(path.read_text())
    except OSError:
        raise ConfigError(
            f"{flag} {directory} has no {CONFIG}; name a directory written by save_pretrained"
        ) from None
    except ValueError as e:
        raise ConfigError(f"{flag} {directory}: {CONFIG} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{flag} {directory}: {CONFIG} is not a JSON object")
    return config
