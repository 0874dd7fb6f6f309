"""``FeatureEmbed``: continuous per-token inputs (image patches) into the residual stream."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers.context import active
from colossal_jax.tensor.features import embed_features


class FeatureEmbed(nnx.Module):
    """``y = x @ W + b`` from per-token feature vectors ``x: [b, s, in_features]`` (laid out like
    token ids) to the residual stream ``[b, s, features]``: the embedding of inputs that are not
    ids, e.g. a ViT's flattened patches (:mod:`colossal_jax.tensor.features`)."""

    def __init__(
        self,
        in_features: int,
        features: int,
        *,
        rngs: nnx.Rngs,
        use_bias: bool = True,
        init_std: float = 0.02,
    ):
        self.kernel = nnx.Param(
            jax.nn.initializers.normal(init_std)(
                rngs.params(), (in_features, features), jnp.float32
            ),
            role="weight_features",
        )
        self.bias = (
            nnx.Param(jnp.zeros((features,), jnp.float32), role="bias_features")
            if use_bias
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        b = None if self.bias is None else self.bias[...]
        return embed_features(active().layout, x, self.kernel[...], b)
