"""DeepSpeed-Ulysses sequence parallelism: all-to-all from sequence-split to head-split.

Algorithm: DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for
Enabling Training of Extreme Long Sequence Transformer Models", arXiv 2309.14509). Each of the
``p`` devices on ``axis_name`` holds ``q, k, v: [b, s/p, a, d]``. One all-to-all per tensor
re-splits them to ``[b, s, a/p, d]`` (whole sequence, ``a/p`` heads), the positions are
all-gathered to ``[b, s]``, ordinary attention
(:func:`colossal_jax.sequence.local.dot_product_attention`) runs on the local heads, and one
all-to-all turns the ``[b, s, a/p, d]`` output back into ``[b, s/p, a, d]``.

Per-device cost (``h = a * d``, ``n = b * s / p``):
- communication: 4 all-to-alls forward (q, k, v, out), each sending ``(p-1)/p * n * h``
  elements; 4 more in backward; plus an all-gather of ``b * s`` integer positions.
- memory: full-length attention on ``a/p`` heads: scores ``[b, a/p, s, s]`` float32
  (``O(b a s^2 / p)``), and the ``[b, s, a/p, d]`` q, k, v, out.

Requires ``a % p == 0`` (the number of local heads divisible by the sequence-parallel size).
Grouped-query attention (``g`` K/V heads, ``g`` dividing ``a``): K/V are re-split by heads too,
so where ``p`` does not divide ``g`` each K/V head is first repeated ``p / gcd(g, p)`` times (to
``lcm(g, p)`` heads, which divides ``a``): the K/V all-to-alls then move ``lcm(g, p)/a`` of the
multi-head bytes instead of ``g/a`` (never more than multi-head attention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from colossal_jax.config.parallel_rules import check_ulysses_heads
from colossal_jax.sequence.cost import ulysses_kv_repeat
from colossal_jax.sequence.fused import fused_attention
from colossal_jax.sequence.local import dot_product_attention


def ulysses_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    axis_name: str,
    causal: bool = True,
    implementation: str = "xla",
) -> jax.Array:
    """Ulysses attention over ``axis_name``; call *inside* a ``shard_map`` including that axis.

    Args:
      q, k, v: this device's blocks ``[b, s_local, a, d]`` (``k, v``: ``[b, s_local, g, d]``
        with ``g`` dividing ``a`` under grouped-query attention).
      q_pos, k_pos: integer global token positions ``[b, s_local]``.
      axis_name: the sequence-parallel mesh axis.
      causal: mask keys with ``k_pos > q_pos`` (keys with ``k_pos < 0``, padding, always).
      implementation: ``xla`` (position-masked reference) or ``auto``/``cudnn``/``blockwise``
        for the kernels of :mod:`colossal_jax.sequence.fused` on the gathered, in-order
        sequence (valid when the positions are contiguous and ascending, as the training loop
        lays them out, with any padding trailing).

    Returns:
      ``[b, s_local, a, d]`` in ``q``'s dtype.

    Raises:
      ValueError: if the number of (local) heads ``a`` is not divisible by the axis size.
    """
    p = jax.lax.axis_size(axis_name)
    heads = q.shape[2]
    check_ulysses_heads(heads, p)
    r = ulysses_kv_repeat(k.shape[2], p)
    if r > 1:
        # grouped-query attention with fewer K/V heads than devices (or not a multiple): repeat
        # each K/V head r times so the lcm(g, p) heads split p ways; every query head still
        # reads the copy of its own key head
        k, v = jnp.repeat(k, r, axis=2), jnp.repeat(v, r, axis=2)

    def seq_to_heads(x: jax.Array) -> jax.Array:
        return jax.lax.all_to_all(x, axis_name, split_axis=2, concat_axis=1, tiled=True)

    qh, kh, vh = seq_to_heads(q), seq_to_heads(k), seq_to_heads(v)
    q_full = jax.lax.all_gather(q_pos, axis_name, axis=1, tiled=True)
    k_full = jax.lax.all_gather(k_pos, axis_name, axis=1, tiled=True)
    if implementation == "xla":
        out = dot_product_attention(qh, kh, vh, q_full, k_full, causal=causal)
    else:
        out = fused_attention(
            qh, kh, vh, q_full, k_full, causal=causal, implementation=implementation
        )
    out = jax.lax.all_to_all(out, axis_name, split_axis=1, concat_axis=2, tiled=True)
    return out.astype(q.dtype)
