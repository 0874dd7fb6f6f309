"""Attention on one device's blocks, masked by token positions (the reference every sequence
kernel is tested against).

Masking by *positions* rather than by array index is what lets the sequence be split and
reordered (zigzag load balancing). Two rules, shared by every kernel through :func:`visible`:

- **padding**: a token whose position is negative is padding; no query ever attends to it
  (its key is masked for every query, causal or not);
- **causal** (``causal=True``): a key is visible to a query when ``k_pos <= q_pos``.

A query that sees no key at all (a padding query under the causal mask, a row of only padding)
outputs zeros and passes zero gradient.

Memory: the full ``[b, heads, s_q, s_k]`` score matrix; communication: none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def visible(q_pos: jax.Array, k_pos: jax.Array, causal: bool) -> jax.Array:
    """Boolean ``[b, 1, sq, sk]``: which key each query may attend to (see module docstring)."""
    keep = (k_pos >= 0)[:, None, None, :]
    if causal:
        keep = keep & (k_pos[:, None, None, :] <= q_pos[:, None, :, None])
    return keep


def masked_softmax(scores: jax.Array, keep: jax.Array) -> jax.Array:
    """Softmax over the last axis of float32 ``scores`` restricted to ``keep``; rows with no
    visible entry are all zeros, with zero (never NaN) gradient."""
    s = jnp.where(keep, scores, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isneginf(m), 0.0, m))
    e = jnp.exp(s - m)  # masked -> exp(-inf) = 0
    den = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(den > 0, den, 1.0)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    causal: bool = True,
) -> jax.Array:
    """Softmax attention. ``q: [b, sq, a, d]``, ``k, v: [b, sk, a, d]``, positions ``[b, s*]``
    (negative: padding). Scores and softmax are computed in float32; the result has ``q``'s
    dtype."""
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("bqad,bkad->baqk", q, k, preferred_element_type=jnp.float32) * scale
    probs = masked_softmax(scores, visible(q_pos, k_pos, causal))
    out = jnp.einsum("baqk,bkad->bqad", probs.astype(v.dtype), v)
    return out.astype(q.dtype)
