"""colossal-jax: train transformers (GPT, BERT, ViT) with data, tensor, sequence and pipeline
parallelism in JAX.

Train from a script::

    import colossal_jax as cj

    cj.simulate_cpu_devices(8)  # on a CPU, before anything touches JAX
    cfg = cj.TrainConfig(steps=50, parallel=cj.ParallelConfig(data=2, tensor_row=4,
                                                              tensor_mode="1d"))
    result = cj.train(cfg)
    print(result.losses[-1], result.final_eval_loss, result.params)

Importing this package is cheap: it does not import JAX or start its backends; the names that
need JAX (``train``, ``build_mesh``, ``MODELS``, …) are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from colossal_jax.config import ConfigError, OptimConfig, ParallelConfig, TrainConfig, parse_mesh
from colossal_jax.runtime.devices import simulate_cpu_devices

_LAZY = {  # name -> module holding it (imports JAX when first used)
    "train": "colossal_jax.training.trainer",
    "build": "colossal_jax.training.run",
    "init_state": "colossal_jax.training.run",
    "restore": "colossal_jax.training.run",
    "Run": "colossal_jax.training.run",
    "evaluate": "colossal_jax.training.evaluation",
    "evaluate_metrics": "colossal_jax.training.evaluation",
    "Summary": "colossal_jax.training.summary",
    "TrainResult": "colossal_jax.training.summary",
    "build_mesh": "colossal_jax.parallel.mesh",
    "MODELS": "colossal_jax.config.families",
    "FAMILIES": "colossal_jax.config.families",
    "model_config": "colossal_jax.config.families",
    "Family": "colossal_jax.config.families",
    "register": "colossal_jax.config.families",
    "Sampler": "colossal_jax.generate",
    "Sampling": "colossal_jax.generate",
}

__all__ = [
    "ConfigError",
    "FAMILIES",
    "Family",
    "MODELS",
    "OptimConfig",
    "ParallelConfig",
    "Run",
    "Sampler",
    "Sampling",
    "Summary",
    "TrainConfig",
    "TrainResult",
    "build",
    "build_mesh",
    "evaluate",
    "evaluate_metrics",
    "init_state",
    "model_config",
    "parse_mesh",
    "register",
    "restore",
    "simulate_cpu_devices",
    "train",
]

if TYPE_CHECKING:  # pragma: no cover
    from colossal_jax.config.families import FAMILIES, MODELS, model_config
    from colossal_jax.generate import Sampler, Sampling
    from colossal_jax.parallel.mesh import build_mesh
    from colossal_jax.training.evaluation import evaluate, evaluate_metrics
    from colossal_jax.training.run import Run, build, init_state, restore
    from colossal_jax.training.summary import Summary, TrainResult
    from colossal_jax.training.trainer import train


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    zoo = _zoo_class(name)
    if zoo is not None:
        return zoo
    raise AttributeError(f"module 'colossal_jax' has no attribute {name!r}")


def _zoo_class(name: str) -> type | None:
    """A registered family's config class (``GPTConfig``) or module class (``GPT``, imports
    JAX): the zoo is reached through the registry, never imported by the library."""
    from colossal_jax.config.families import FAMILIES

    for family in FAMILIES.values():
        if family.config_class.__name__ == name:
            return family.config_class
        if family.module.rpartition(":")[2] == name:
            return family.module_class()
    return None


def __dir__() -> list[str]:
    from colossal_jax.config.families import FAMILIES

    zoo = [f.config_class.__name__ for f in FAMILIES.values()]
    zoo += [f.module.rpartition(":")[2] for f in FAMILIES.values()]
    return sorted(set(globals()) | set(__all__) | set(zoo))
