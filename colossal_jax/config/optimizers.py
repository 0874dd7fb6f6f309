"""The optimizers, one registered :class:`Optimizer` each: its name and help, the optax
transforms it runs, and what its state holds (for the memory floor and for resuming).

The built-in optimizers — ``adamw``, ``lamb``, ``lars`` and ``sgd`` — are registered at the
bottom of this module; their transforms are in :mod:`colossal_jax.training.optim`. A new
optimizer is its transform function and one :func:`register` call. Nothing here imports JAX or
optax: the transform is a ``"package.module:Name"`` reference imported when a run builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_jax.config.registry import Reference, Registry, resolve


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
