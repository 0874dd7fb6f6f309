"""Ring self-attention: the sequence parallelism of the Colossal-AI paper.

Algorithm: Li, Xue, Baranwal, Li, You 2021, "Sequence Parallelism: Long Sequence Training from
System Perspective", arXiv 2105.13120. Each of the ``p`` devices on ``axis_name`` holds
``q, k, v: [b, s/p, a, d]``. Two rings:

- **RingQK**: the key block (and its positions) is passed ``p - 1`` times around the ring
  (``ppermute`` ``j -> j + 1``); each step fills one ``[s/p, s/p]`` slice of the device's full
  score rows ``[b, a, s/p, s]`` (float32). The rows are masked (padding keys, negative
  positions, always; ``k_pos <= q_pos`` when causal) and soft-maxed over the whole sequence at
  once.
- **RingAV**: the value block is passed ``p - 1`` times around the ring in the same order; each
  step accumulates ``probs[:, :, :, block] @ v_block``.

Keys and values may have fewer heads than queries (grouped-query attention; only those travel).

Gradients come from plain autodiff (the paper's baseline; no custom backward), which transposes
each ``ppermute`` into the reverse ring.

Per-device cost (``h = a * d``, ``n = b * s/p``):
- communication: forward ``(p-1)`` hops of k and ``(p-1)`` hops of v = ``2 (p-1) n h``
  elements (+ positions); backward the same again for dK, dV (reverse direction), with k, v
  blocks saved rather than re-sent.
- memory: the full score and probability rows ``[b, a, s/p, s]`` float32
  (``O(b a s^2 / p)``), plus the ``p`` received k and v blocks kept for autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from colossal_jax.sequence.local import grouped_scores, grouped_values, masked_softmax, visible
from colossal_jax.tensor.kernels import ring_shift


def ring_self_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    axis_name: str,
    causal: bool = True,
) -> jax.Array:
    """Ring self-attention over ``axis_name``; call *inside* a ``shard_map`` with that axis.

    Args:
      q, k, v: this device's blocks ``[b, s_local, a, d]``.
      q_pos, k_pos: integer global token positions ``[b, s_local]``.
      axis_name: the sequence-parallel mesh axis.
      causal: mask keys with ``k_pos > q_pos`` (keys with ``k_pos < 0``, padding, always).

    Returns:
      ``[b, s_local, a, d]`` in ``q``'s dtype.
    """
    p = jax.lax.axis_size(axis_name)
    scale = q.shape[-1] ** -0.5

    # RingQK: at step t this device holds the key block of device (i - t) mod p.
    blocks, keeps = [], []
    k_t, kp_t = k, k_pos
    for t in range(p):
        if t > 0:
            k_t, kp_t = ring_shift((k_t, kp_t), axis_name, p)
        s = grouped_scores(q, k_t) * scale
        blocks.append(s)
        keeps.append(visible(q_pos, kp_t, causal))
    scores = jnp.concatenate(blocks, axis=-1)  # [b, a, s_local, s], key blocks in ring order
    # rows with no visible key (padding queries) are zeros, with zero gradient
    probs = masked_softmax(scores, jnp.concatenate(keeps, axis=-1))

    # RingAV: the value blocks arrive in the same order as the key blocks did.
    s_loc = k.shape[1]
    out = None
    v_t = v
    for t in range(p):
        if t > 0:
            v_t = ring_shift(v_t, axis_name, p)
        pr = probs[..., t * s_loc : (t + 1) * s_loc].astype(v.dtype)
        part = grouped_values(pr, v_t)
        out = part if out is None else out + part
    return out.astype(q.dtype)
