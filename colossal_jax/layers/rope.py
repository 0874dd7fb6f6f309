"""Rotary position embedding (RoPE; Su et al. 2021, arXiv 2104.09864) from explicit positions.

The rotation angle of each query/key comes from its *global token position*, passed alongside
the block, never from its index in the local array. So RoPE stays exact when the sequence is
split over devices (contiguous, zigzag) and keys travel around a ring: each key block is rotated
once, at its own positions, before it leaves its device. Padding tokens (negative positions, the
kernels' padding mask) are rotated as position 0.

Communication: none. Memory: the ``[b, s, d/2]`` angle table of the local block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from colossal_jax.tensor.layout import LocalAttention


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotate ``x: [b, s, a, d]`` (``d`` even) by ``positions: [b, s]``; half-split pairing
    (dimension ``i`` with ``i + d/2``, as GPT-NeoX and Llama)."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {d}")
    inv_freq = theta ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2.0 / d)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, s, d/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _rotated(q, k, v, q_pos, k_pos, *, inner: LocalAttention, theta: float, **kwargs):
    # padding carries a negative position (the mask's signal, passed on unchanged); its rotation
    # uses position 0, so no angle is ever computed from a negative position
    q_rot = apply_rope(q, jnp.maximum(q_pos, 0), theta)
    k_rot = apply_rope(k, jnp.maximum(k_pos, 0), theta)
    return inner(q_rot, k_rot, v, q_pos, k_pos, **kwargs)


def with_rope(local_attention: LocalAttention, theta: float = 10000.0) -> LocalAttention:
    """``local_attention`` with queries and keys rotated by their positions first (padding,
    negative positions, rotated as position 0 and still masked by the kernel)."""
    return functools.partial(_rotated, inner=local_attention, theta=theta)
