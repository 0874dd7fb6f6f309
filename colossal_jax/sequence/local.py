"""Attention on one device's blocks, masked by token positions (the reference every sequence
kernel is tested against).

Masking by *positions* rather than by array index is what lets the sequence be split and
reordered (zigzag load balancing): a key is visible to a query when ``k_pos <= q_pos``.

Memory: the full ``[b, heads, s_q, s_k]`` score matrix; communication: none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    causal: bool = True,
) -> jax.Array:
    """Softmax attention. ``q: [b, sq, a, d]``, ``k, v: [b, sk, a, d]``, positions ``[b, s*]``.

    Scores and softmax are computed in float32; the result has ``q``'s dtype.
    """
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("bqad,bkad->baqk", q, k, preferred_element_type=jnp.float32) * scale
    if causal:
        visible = k_pos[:, None, None, :] <= q_pos[:, None, :, None]
        scores = jnp.where(visible, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(jnp.isnan(probs), 0.0, probs)  # rows with no visible key
    out = jnp.einsum("baqk,bkad->bqad", probs.astype(v.dtype), v)
    return out.astype(q.dtype)
