"""The model-family registry: the protocol a family's config implements, and ``register``.

A *family* (GPT, BERT, ViT, LLaMA, …) is one :class:`Family`: its JAX-free config class and named
sizes, where its Flax module lives (imported only when a run builds it), the data task it trains
on (:data:`TASKS`) and the training defaults a run of it starts from. The library never imports
a model: families register themselves here. The model zoo (the repository's ``models/``,
installed as ``colossal_jax_models``) is found through the ``colossal_jax.families`` entry-point
group of the installed distributions and loaded the first time the registry is read
(:data:`FAMILIES`, :data:`MODELS` or a lookup), so ``--model gpt2-tiny`` works from any script,
and another package can add families by declaring an entry point of its own. Code may also call
:func:`register` directly (a test, a notebook).

Nothing here imports JAX or Flax.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

TASKS = ("causal_lm", "masked_lm", "image_classification")
"""Data tasks: next-token prediction (:mod:`colossal_jax.data.corpus`), masked-token prediction
(:mod:`colossal_jax.data.masked_lm`), image classification (:mod:`colossal_jax.data.images`)."""


class ModelConfig(Protocol):
    """What the rules, the memory floor and MFU read of any family's config."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int  # the wide output of the head (a vocabulary, or padded classes)
    block_size: int  # rows of the learned position table (the longest sequence)

    @property
    def mlp_width(self) -> int: ...

    def matmul_params(self) -> int:
        """Parameters in matmuls, the N of ``6·N`` training FLOPs per token."""
        ...

    def param_count(self) -> int:
        """Every parameter of the family's module built from this config."""
        ...

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (per image: times the image's tokens) for MFU."""
        ...


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
      name: the family's short name (``gpt``).
      paper: the architecture's reference.
      task: the data task it trains on, one of :data:`TASKS`.
      config_class: its frozen, JAX-free config dataclass.
      sizes: named configs (``gpt2-tiny`` …); names are unique across families.
      module: ``"package.module:Class"`` of its Flax nnx module. (Whether its attention is
        causal is the config's ``causal``, absent meaning causal: :func:`colossal_jax.config.
        is_causal`.)
      train_defaults: TrainConfig fields (``optim.<field>`` for the optimizer's: ``lr`` and
        ``warmup_steps`` are the ones the command line defaults) that a run of this family
        starts from; the command line and explicit fields override them.
      size_defaults: per-size additions to ``train_defaults``.
    """

    name: str
    paper: str
    task: str
    config_class: type
    sizes: Mapping[str, Any]
    module: str
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    size_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def module_class(self) -> type:
        """The Flax module class (imports JAX and Flax)."""
        path, _, name = self.module.partition(":")
        return getattr(importlib.import_module(path), name)

    def build(self, cfg: Any, *, rngs: Any, unroll: bool | None = None) -> Any:
        """The module for ``cfg`` (call under ``nnx.eval_shape`` for an abstract one)."""
        return self.module_class()(cfg, rngs=rngs, unroll=unroll)


ENTRY_POINTS = "colossal_jax.families"
"""Entry-point group whose modules register families when imported (the zoo's is
``colossal_jax_models.registry``)."""

_families: dict[str, Family] = {}
_models: dict[str, Any] = {}
_plugins_loaded = False


def load_plugins() -> None:
    """Import every module of the :data:`ENTRY_POINTS` group once (they call :func:`register`)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINTS):
        entry.load()


class _Table(Mapping):
    """A read-only view of a registry table that loads the plugins on first use."""

    def __init__(self, table: dict[str, Any]):
        self._table = table

    def __getitem__(self, key: str) -> Any:
        load_plugins()
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        load_plugins()
        return iter(self._table)

    def __len__(self) -> int:
        load_plugins()
        return len(self._table)

    def __repr__(self) -> str:
        return repr(dict(self))


FAMILIES: Mapping[str, Family] = _Table(_families)
"""Family name -> :class:`Family`, in registration order."""
MODELS: Mapping[str, Any] = _Table(_models)
"""Every named size of every family -> its config."""


def register(family: Family) -> Family:
    """Add ``family`` and its sizes (a name already taken is an error)."""
    if family.task not in TASKS:
        raise ValueError(f"family {family.name}: task {family.task!r} is not one of {TASKS}")
    if family.name in _families:
        raise ValueError(f"model family {family.name!r} is registered twice")
    taken = sorted(set(family.sizes) & set(_models))
    if taken:
        raise ValueError(f"family {family.name}: model names {taken} are taken")
    for name, cfg in family.sizes.items():
        if not isinstance(cfg, family.config_class):
            raise ValueError(f"{name} is not a {family.config_class.__name__}")
    _families[family.name] = family
    _models.update(family.sizes)
    return family


def config_class(name: str) -> type:
    """The registered config class named ``name`` (``ViTConfig``); ``KeyError`` if none."""
    for family in FAMILIES.values():
        if family.config_class.__name__ == name:
            return family.config_class
    raise KeyError(f"no registered model family has the config class {name!r}")


def unregister(name: str) -> None:
    """Remove the family ``name`` and its sizes (a test's own family, when it is done)."""
    family = _families.pop(name)
    for size in family.sizes:
        _models.pop(size, None)


def family_of(name: str) -> Family:
    """The family of the model ``name``; ``KeyError`` names the valid models."""
    for family in FAMILIES.values():
        if name in family.sizes:
            return family
    if not MODELS:
        raise KeyError(
            f"--model {name!r}: no model family is registered; the zoo registers through the "
            "installed package's entry point, so install it: pip install -e . (without a network: "
            "pip install --no-deps --no-build-isolation -e .)"
        )
    raise KeyError(f"--model {name!r} is unknown; choose one of {', '.join(MODELS)}")


def model_config(name: str, **overrides: Any) -> Any:
    """The named config with field overrides; ``KeyError`` names the valid models, ``TypeError``
    an unknown field."""
    family_of(name)
    return dataclasses.replace(MODELS[name], **overrides)


def task_of(name: str) -> str:
    """The data task of the model ``name``."""
    return family_of(name).task


def train_defaults(name: str) -> dict[str, Any]:
    """The TrainConfig fields (``optim.<field>`` for the optimizer's) a run of ``name`` starts
    from: its family's, then its size's."""
    family = family_of(name)
    return {**family.train_defaults, **family.size_defaults.get(name, {})}
