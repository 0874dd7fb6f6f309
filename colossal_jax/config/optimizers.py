"""The optimizers, one registered :class:`Optimizer` each: its name and help, the optax
transforms it runs, and what its state holds (for the memory floor and for resuming).

The built-in optimizers — ``adamw``, ``lamb``, ``lars`` and ``sgd`` — are registered at the
bottom of this module; their transforms are in :mod:`colossal_jax.training.optim`. A new
optimizer is its transform function and one :func:`register` call. Nothing here imports JAX or
optax: the transform is a ``"package.module:Name"`` reference imported when a run builds it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from colossal_jax.config.errors import ConfigError, choice
from colossal_jax.config.registry import Reference, Registry, resolve

if TYPE_CHECKING:
    from colossal_jax.config.schema import OptimConfig

LR_SCHEDULES = ("cosine", "poly")
"""``--lr-schedule``: linear warm-up, then cosine decay (``cosine``) or polynomial decay of power
``optim.poly_power`` (``poly``, the LARS and LAMB papers' schedule) to ``min_lr_ratio·lr``."""
LR_SCALINGS = ("none", "sqrt", "linear")
"""``--lr-scaling``: how the learning rate follows the batch from ``--base-batch`` (see
:func:`for_batch`)."""


@dataclass(frozen=True)
class Optimizer:
    """An optimizer.

    Attributes:
      name: the ``--optimizer`` value (``OptimConfig.name``).
      help: one line saying what it is.
      transform: ``transform(cfg: OptimConfig, lr: optax.Schedule) -> list of optax
        GradientTransformation``, the optimizer's part of the chain after gradient clipping
        (:func:`colossal_jax.training.optim.make_optimizer`), a ``"package.module:Name"``
        reference or the function.
      slots: fp32 values per parameter its state keeps (Adam's two moments, a momentum).
      momentum_from_b1: its one slot, a momentum, exists only when ``b1 > 0`` (``optax.sgd``),
        so ``b1`` changes the state's structure.
      torch_baseline: the PyTorch baseline (``--baseline torch``) trains with it.
    """

    name: str
    help: str
    transform: Reference
    slots: int
    momentum_from_b1: bool = False
    torch_baseline: bool = False

    def state_slots(self, b1: float) -> int:
        """fp32 values per parameter its state keeps with momentum ``b1``."""
        return 0 if self.momentum_from_b1 and not b1 else self.slots

    def transform_function(self):
        """The transform function (imports optax)."""
        return resolve(self.transform)


TABLE: Registry[Optimizer] = Registry("optimizer", "--optimizer")
"""Every optimizer, by name, in registration order."""
register = TABLE.register
unregister = TABLE.unregister


def optimizer(name: str) -> Optimizer:
    """The registered optimizer ``name``; :class:`ConfigError` names the registered ones."""
    return TABLE.get(name)


register(
    Optimizer(
        "adamw",
        "AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay",
        "colossal_jax.training.optim:adamw",
        slots=2,
        torch_baseline=True,
    )
)
register(
    Optimizer(
        "lamb",
        "LAMB (You et al. 2019): Adam moments with a per-layer trust ratio",
        "colossal_jax.training.optim:lamb",
        slots=2,
    )
)
register(
    Optimizer(
        "lars",
        "LARS (You, Gitman, Ginsburg 2017): momentum with a per-layer trust ratio",
        "colossal_jax.training.optim:lars",
        slots=1,
    )
)
register(
    Optimizer(
        "sgd",
        "SGD with weight decay, and momentum b1 when b1 > 0",
        "colossal_jax.training.optim:sgd",
        slots=1,
        momentum_from_b1=True,
    )
)


def for_batch(optim: OptimConfig, batch_size: int) -> OptimConfig:
    """``optim`` for a global batch of ``batch_size`` under its ``lr_scaling`` rule, with
    ``k = batch_size / base_batch``:

    - ``linear`` (Goyal et al. 2017, arXiv 1706.02677): ``lr·k``; the warm-up keeps its samples
      (the paper's 5 epochs at every batch), so its steps are divided by ``k``;
    - ``sqrt`` (LAMB, You et al. 2019, arXiv 1904.00962, with the linear-epoch warm-up of You et
      al. 2018, arXiv 1806.00250): ``lr·√k``; the warm-up's epochs grow with ``k``, so its steps
      stay the same;
    - ``none``: ``optim`` unchanged.

    ``lr`` and ``warmup_steps`` are read as those of the base batch. The result's ``base_batch``
    is ``batch_size``, so applying it again changes nothing.
    """
    if optim.lr_scaling == "none" or optim.base_batch == batch_size:
        return optim
    k = batch_size / optim.base_batch
    if optim.lr_scaling == "sqrt":
        lr, warmup = optim.lr * math.sqrt(k), optim.warmup_steps
    else:
        lr, warmup = optim.lr * k, max(round(optim.warmup_steps / k), 0)
    return dataclasses.replace(optim, lr=lr, warmup_steps=warmup, base_batch=batch_size)


def check_recipe(optim: OptimConfig) -> None:
    """The schedule and scaling fields: a known ``--lr-schedule`` and ``--lr-scaling``, a
    positive ``--base-batch`` where a scaling rule needs it, a positive polynomial power and a
    trust-ratio bound that is 0 (none) or positive."""
    for flag, value, valid in (
        ("--lr-schedule", optim.lr_schedule, LR_SCHEDULES),
        ("--lr-scaling", optim.lr_scaling, LR_SCALINGS),
    ):
        if value not in valid:
            raise ConfigError(choice(flag, value, valid))
    if optim.lr_scaling != "none" and optim.base_batch < 1:
        raise ConfigError(
            f"--lr-scaling {optim.lr_scaling} needs the batch the learning rate was set for: "
            f"--base-batch {optim.base_batch} must be ≥ 1 (e.g. --base-batch 32)"
        )
    for key, value, example in (
        ("poly_power", optim.poly_power, "1.0"),
        ("trust_ratio_max", optim.trust_ratio_max, "10"),
    ):
        if not (math.isfinite(value) and value >= 0) or (key == "poly_power" and value == 0):
            bound = "> 0" if key == "poly_power" else "≥ 0 (0: unbounded)"
            raise ConfigError(
                f"--set optim.{key}={value} must be a finite number {bound}; e.g. "
                f"--set optim.{key}={example}"
            )
