"""The model zoo: every family's config class, named sizes, Flax module and data task.

A *family* (GPT, BERT, ViT, …) is declared once, here, as a :class:`Family`: its JAX-free config
class and named sizes, where its Flax module lives (imported only when a run builds it), the data
task it trains on (:data:`TASKS`) and the training defaults a run of it starts from. Everything
else finds a model through this module: ``--model NAME`` picks any family's size, the rules size
it (:mod:`colossal_jax.rules`), ``train.py`` builds it, ``--list-models`` prints the zoo.

Nothing here imports JAX or Flax. A family's config lives in its own file
(``models/gpt_config.py`` …) and implements :class:`ModelConfig`; its module, built as
``cls(cfg, rngs=rngs, unroll=unroll)``, is ``embed(tokens, positions) → blocks (a
colossal_jax.layers.Stack) → head_loss(x, targets, weights)``, the three parts pipelines, ZeRO,
remat and gradient accumulation wrap, plus ``logits(x)`` for evaluation.

To add a family: write ``models/<name>_config.py`` and ``models/<name>.py``, then one
``register(Family(...))`` line below.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from models.bert_config import BERT_MODELS, BertConfig
from models.gpt_config import GPT_MODELS, GPTConfig
from models.llama_config import LLAMA_MODELS, LlamaConfig
from models.vit_config import VIT_MODELS, ViTConfig

TASKS = ("causal_lm", "masked_lm", "image_classification")
"""Data tasks: next-token prediction (:mod:`colossal_jax.data`), masked-token prediction
(:mod:`colossal_jax.masked_lm`), image classification (:mod:`colossal_jax.images`)."""


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
        causal is the config's ``causal``, absent meaning causal: :func:`colossal_jax.rules.
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


FAMILIES: dict[str, Family] = {}
"""Family name -> :class:`Family`, in registration order."""
MODELS: dict[str, Any] = {}
"""Every named size of every family -> its config."""


def register(family: Family) -> Family:
    """Add ``family`` and its sizes (a name already taken is an error)."""
    if family.task not in TASKS:
        raise ValueError(f"family {family.name}: task {family.task!r} is not one of {TASKS}")
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    taken = sorted(set(family.sizes) & set(MODELS))
    if taken:
        raise ValueError(f"family {family.name}: model names {taken} are taken")
    for name, cfg in family.sizes.items():
        if not isinstance(cfg, family.config_class):
            raise ValueError(f"{name} is not a {family.config_class.__name__}")
    FAMILIES[family.name] = family
    MODELS.update(family.sizes)
    return family


register(
    Family(
        "gpt",
        "Radford et al. 2019; Brown et al. 2020",
        "causal_lm",
        GPTConfig,
        GPT_MODELS,
        "models.gpt:GPT",
    )
)
register(
    Family(
        "bert",
        "Devlin et al. 2019",
        "masked_lm",
        BertConfig,
        BERT_MODELS,
        "models.bert:Bert",
    )
)
register(
    Family(
        "vit",
        "Dosovitskiy et al. 2021",
        "image_classification",
        ViTConfig,
        VIT_MODELS,
        "models.vit:ViT",
        train_defaults={"data": "shapes"},
        size_defaults={
            "vit-tiny": {
                "data": "digits",
                "seq_len": VIT_MODELS["vit-tiny"].seq_len,
                "steps": 200,
                "batch_size": 120,
                "eval_every": 50,
                "optim.lr": 3e-3,
                "optim.warmup_steps": 20,
            },
            **{n: {"seq_len": m.seq_len} for n, m in VIT_MODELS.items() if n != "vit-tiny"},
        },
    )
)
register(
    Family(
        "llama",
        "Touvron et al. 2023; Dubey et al. 2024",
        "causal_lm",
        LlamaConfig,
        LLAMA_MODELS,
        "models.llama:Llama",
    )
)


def family_of(name: str) -> Family:
    """The family of the model ``name``; ``KeyError`` names the valid models."""
    for family in FAMILIES.values():
        if name in family.sizes:
            return family
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
