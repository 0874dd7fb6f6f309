"""colossal-jax: train GPT models with data, tensor, sequence and pipeline parallelism in JAX.

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

from colossal_jax.config import (
    ConfigError,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    parse_mesh,
)
from colossal_jax.devices import simulate_cpu_devices

_LAZY = {  # name -> module holding it (imports JAX when first used)
    "train": "colossal_jax.train",
    "build": "colossal_jax.train",
    "init_state": "colossal_jax.train",
    "evaluate": "colossal_jax.train",
    "restore": "colossal_jax.train",
    "Run": "colossal_jax.train",
    "Summary": "colossal_jax.train",
    "TrainResult": "colossal_jax.train",
    "build_mesh": "colossal_jax.mesh",
    "MODELS": "models.gpt",
    "model_config": "models.gpt",
    "GPTConfig": "models.gpt",
    "GPT": "models.gpt",
    "Sampler": "colossal_jax.generate",
    "Sampling": "colossal_jax.generate",
}

__all__ = [
    "ConfigError",
    "GPT",
    "GPTConfig",
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
    "init_state",
    "model_config",
    "parse_mesh",
    "restore",
    "simulate_cpu_devices",
    "train",
]

if TYPE_CHECKING:  # pragma: no cover
    from colossal_jax.generate import Sampler, Sampling
    from colossal_jax.mesh import build_mesh
    from colossal_jax.train import (
        Run,
        Summary,
        TrainResult,
        build,
        evaluate,
        init_state,
        restore,
        train,
    )
    from models.gpt import GPT, MODELS, GPTConfig, model_config


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'colossal_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
