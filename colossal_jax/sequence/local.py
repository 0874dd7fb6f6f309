"""Attention on one device's blocks, masked by token positions (the reference every sequence
kernel is tested against).

Masking by *positions* rather than by array index is what lets the sequence be split and
reordered (zigzag load balancing). Two rules, shared by every kernel through :func:`visible`:

- **padding**: a token whose position is negative is padding; no query ever attends to it
  (its key is masked for every query, causal or not);
- **causal** (``causal=True``): a key is visible to a query when ``k_pos <= q_pos``.

A query that sees no key at all (a padding query under the causal mask, a row of only padding)
outputs zeros and passes zero gradient.

Keys and values may have fewer heads than queries (grouped-query attention): every kernel takes
``k, v: [b, s, g, d]`` with ``g`` dividing the query heads and computes through the grouped
products below, so K/V blocks keep (and send) only their ``g`` heads.

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
    # jax.nn.softmax (its own max shift and derivative); a row with nothing visible takes the
    # softmax of its raw scores (finite) and is then zeroed, so neither value nor gradient is NaN
    blind = ~jnp.any(keep, axis=-1, keepdims=True)
    probs = jax.nn.softmax(jnp.where(keep | blind, scores, -jnp.inf), axis=-1)
    return jnp.where(keep, probs, 0.0)


def grouped_scores(q: jax.Array, k: jax.Array) -> jax.Array:
    """Float32 ``q·kᵀ`` scores ``[b, a, sq, sk]`` of ``q: [b, sq, a, d]`` and ``k: [b, sk, g, d]``
    with ``g`` dividing ``a``: grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245),
    query head ``i`` reads key head ``i // (a/g)`` (``g = a``: multi-head, ``g = 1``:
    multi-query). Each key head is read once per group, never copied ``a/g`` times. With
    ``g = a`` the product has no group axis: the grouped form's ``[b, g, r, q, k]`` result is
    stored query-major by XLA and its reshape to ``[b, a, q, k]`` copied the whole score matrix
    in every layer (and again in the backward pass)."""
    b, sq, a, d = q.shape
    g = k.shape[2]
    if g == a:  # multi-head: no group axis, so no transposed copy of the scores
        return jnp.einsum("bqad,bkad->baqk", q, k, preferred_element_type=jnp.float32)
    qg = q.reshape(b, sq, g, a // g, d)
    s = jnp.einsum("bqgrd,bkgd->bgrqk", qg, k, preferred_element_type=jnp.float32)
    return s.reshape(b, a, sq, k.shape[1])


def grouped_values(probs: jax.Array, v: jax.Array) -> jax.Array:
    """``probs @ v`` for ``probs: [b, a, sq, sk]`` and grouped ``v: [b, sk, g, d]`` (see
    :func:`grouped_scores`): float32 ``[b, sq, a, d]``."""
    b, a, sq, sk = probs.shape
    g = v.shape[2]
    if g == a:
        return jnp.einsum("baqk,bkad->bqad", probs, v, preferred_element_type=jnp.float32)
    pg = probs.reshape(b, g, a // g, sq, sk)
    o = jnp.einsum("bgrqk,bkgd->bqgrd", pg, v, preferred_element_type=jnp.float32)
    return o.reshape(b, sq, a, v.shape[-1])


def grouped_key_grad(ds: jax.Array, x: jax.Array, groups: int) -> jax.Array:
    """``dsᵀ @ x`` summed over each group's query heads: the gradient ``[b, sk, g, d]`` (float32)
    of grouped keys (``x = q``) or values (``ds = probs``, ``x = dO``); ``ds: [b, a, sq, sk]``,
    ``x: [b, sq, a, d]``."""
    b, a, sq, sk = ds.shape
    if groups == a:
        return jnp.einsum("baqk,bqad->bkad", ds, x, preferred_element_type=jnp.float32)
    dg = ds.reshape(b, groups, a // groups, sq, sk)
    xg = x.reshape(b, sq, groups, a // groups, x.shape[-1])
    return jnp.einsum("bgrqk,bqgrd->bkgd", dg, xg, preferred_element_type=jnp.float32)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    causal: bool = True,
) -> jax.Array:
    """Softmax attention. ``q: [b, sq, a, d]``, ``k, v: [b, sk, g, d]`` (``g`` dividing ``a``:
    grouped-query attention, :func:`grouped_scores`), positions ``[b, s*]`` (negative: padding).
    Scores and softmax are computed in float32; the result has ``q``'s dtype."""
    scale = q.shape[-1] ** -0.5
    scores = grouped_scores(q, k) * scale
    probs = masked_softmax(scores, visible(q_pos, k_pos, causal))
    return grouped_values(probs.astype(v.dtype), v).astype(q.dtype)
