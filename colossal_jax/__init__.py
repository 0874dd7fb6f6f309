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
    "evaluate_metrics": "colossal_jax.train",
    "MODELS": "models.registry",
    "FAMILIES": "models.registry",
    "model_config": "models.registry",
    "GPTConfig": "models.gpt_config",
    "BertConfig": "models.bert_config",
    "ViTConfig": "models.vit_config",
    "GPT": "models.gpt",
    "Sampler": "colossal_jax.generate",
    "Sampling": "colossal_jax.generate",
    "Bert": "models.bert",
    "ViT": "models.vit",
}

__all__ = [
    "Bert",
    "BertConfig",
    "ConfigError",
    "FAMILIES",
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
    "ViT",
    "ViTConfig",
    "build",
    "build_mesh",
    "evaluate",
    "evaluate_metrics",
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
        evaluate_metrics,
        init_state,
        restore,
        train,
    )
    from models.bert import Bert
    from models.bert_config import BertConfig
    from models.gpt import GPT
    from models.gpt_config import GPTConfig
    from models.registry import FAMILIES, MODELS, model_config
    from models.vit import ViT
    from models.vit_config import ViTConfig


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'colossal_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
