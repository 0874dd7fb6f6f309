"""The library's layers and the switch that routes them to a parallel layout."""

from colossal_jax.layers.context import Parallelism, active, use_parallelism
from colossal_jax.layers.core import (
    MLP,
    Dense,
    Embed,
    HiddenDense,
    LayerNorm,
    RMSNorm,
    SelfAttention,
    SwiGLU,
    cross_entropy,
)
from colossal_jax.layers.features import FeatureEmbed
from colossal_jax.layers.model import SequenceModel
from colossal_jax.layers.stack import Stack, apply_layers, stacked_filter

__all__ = [
    "MLP",
    "Dense",
    "Embed",
    "FeatureEmbed",
    "HiddenDense",
    "LayerNorm",
    "Parallelism",
    "RMSNorm",
    "SelfAttention",
    "SequenceModel",
    "Stack",
    "SwiGLU",
    "apply_layers",
    "stacked_filter",
    "active",
    "cross_entropy",
    "use_parallelism",
]
