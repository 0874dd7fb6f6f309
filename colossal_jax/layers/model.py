"""The three calls every model of the zoo answers, written once over its three parts.

A model is ``embed → blocks → logits`` (token or feature embedding, a layer :class:`Stack`, a
head); pipelines, gradient accumulation and remat wrap those parts, and the training step calls
``loss`` (or ``head_loss`` on the stack's output, inside a pipeline's last stage). A subclass
defines ``embed(tokens, positions)``, ``blocks`` and ``logits(x)``; :class:`SequenceModel` gives
the rest.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers.core import token_loss_sums


class SequenceModel(nnx.Module):
    """``__call__``, ``head_loss`` and ``loss`` of a model made of ``embed``, ``blocks`` and
    ``logits``."""

    def head_loss(
        self, x: jax.Array, targets: jax.Array, weights: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``(sum of weighted token losses, sum of weights)`` of the stack's output ``x``."""
        return token_loss_sums(self.logits(x), targets, weights)

    def __call__(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Logits ``[b, s, vocab]`` for token ids (or features) and their positions."""
        return self.logits(self.blocks(self.embed(tokens, positions), positions))

    def loss(
        self, tokens: jax.Array, positions: jax.Array, targets: jax.Array, weights: jax.Array
    ) -> jax.Array:
        """Mean cross-entropy over the positions with nonzero ``weights`` (the next tokens of a
        causal LM, the masked ones of a masked LM, the class token of an image classifier)."""
        x = self.blocks(self.embed(tokens, positions), positions)
        total, count = self.head_loss(x, targets, weights)
        return total / jnp.maximum(count, 1.0)


__all__ = ["SequenceModel"]
