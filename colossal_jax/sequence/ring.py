"""Ring attention: blockwise attention with K/V passed around the sequence-parallel ring.

Algorithm: Ring Attention (Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers
for Near-Infinite Context", arXiv 2310.01889), with the blockwise online softmax of
FlashAttention (Dao et al. 2022, arXiv 2205.14135; Milakov & Gimelshein 2018).

Each of the ``p`` devices on ``axis_name`` keeps its query block ``q: [b, s/p, a, d]``; the key,
value and key-position blocks travel one hop per step (``ppermute`` ``j -> j + 1``), so at step
``t`` device ``i`` holds the block of device ``(i - t) mod p``. Scores are computed one
``[s/p, s/p]`` block at a time and folded into running ``(m, l, o)`` in float32; the ``[s, s]``
matrix is never built. Masking is by token positions (``k_pos <= q_pos``), never by index, so a
permuted (zigzag, :mod:`colossal_jax.sequence.zigzag`) sequence order works unchanged; keys of
padding tokens (negative positions) are masked for every query, causal or not, and travel the
ring with their positions like every other key. With grouped-query attention (``k, v`` with
``g`` of the ``a`` query heads, :func:`colossal_jax.sequence.local.grouped_scores`) only the
``g`` key/value heads travel: the ring's bytes fall by ``a/g``.

Backward is a ``jax.custom_vjp`` (plain autodiff through the ring would save every rotated block):
residuals are ``q, k, v, positions, out, lse``; with ``D = rowsum(dO * O)``, per block
``P = exp(s - lse)``, ``dV += P^T dO``, ``dP = dO v^T``, ``dS = P * (dP - D) * scale``,
``dQ += dS k``, ``dK += dS^T q``, and ``(k, v, k_pos, dK, dV)`` move one hop per step; after ``p``
hops of ``dK, dV`` (``p - 1`` of ``k, v``) each key block's gradient is home.

Per-device cost (``h = a * d``, ``n = b * s/p``; under grouped-query attention the K/V terms
scale by ``g/a``):
- communication: forward ``(p - 1)`` hops of ``k, v`` = ``2 (p-1) n h`` elements (+ positions);
  backward ``(p - 1)`` hops of ``k, v`` and ``p`` hops of float32 ``dK, dV``
  = ``(4p - 2) n h`` elements. Every hop overlaps with a block of compute under XLA scheduling.
- memory: one ``[b, a, s/p, s/p]`` float32 score block (``O(b a (s/p)^2)``), the running
  ``m, l: [b, a, s/p]`` and ``o: [b, s/p, a, d]`` float32, two K/V blocks in flight; residuals
  ``q, k, v, out`` plus ``lse: [b, a, s/p]`` (named :data:`RING_RESIDUAL`, so a layer remat
  policy keeps them rather than the blocks or a second ring pass).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from colossal_jax.sequence.local import grouped_key_grad, grouped_scores, grouped_values, visible
from colossal_jax.tensor.kernels import ring_shift

RING_RESIDUAL = "ring_residual"
"""The ``checkpoint_name`` of the kernel's output and log-sum-exp in its forward: the remat
policies ``dots`` and ``selective`` keep them (:mod:`colossal_jax.parallel.remat`). Unnamed,
``dots`` saved every hop's score block (the blocks are matmul outputs: ``a·s`` per token, the
whole score matrix) and ``selective`` re-ran the whole ring forward inside the backward."""


def ring_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    axis_name: str,
    causal: bool = True,
) -> jax.Array:
    """Ring attention over ``axis_name``; call *inside* a ``shard_map`` that includes that axis.

    Args:
      q, k, v: this device's blocks ``[b, s_local, a, d]``.
      q_pos, k_pos: integer global token positions ``[b, s_local]``.
      axis_name: the sequence-parallel mesh axis (the only axis communicated over).
      causal: mask keys with ``k_pos > q_pos`` (keys with ``k_pos < 0``, padding, always).

    Returns:
      ``[b, s_local, a, d]`` in ``q``'s dtype, equal to softmax attention over the full sequence.
    """
    return _ring(axis_name, causal, q, k, v, q_pos, k_pos)


def _scores(q, k, q_pos, k_pos, causal: bool, scale: float):
    """Masked float32 score block ``[b, a, sq, sk]``: padding keys (negative positions) always,
    later keys too when ``causal`` (:func:`colossal_jax.sequence.local.visible`)."""
    s = grouped_scores(q, k) * scale
    return jnp.where(visible(q_pos, k_pos, causal), s, -jnp.inf)


def online_softmax_block(carry, q, k, v, q_pos, k_pos, causal, scale):
    """One online-softmax update of ``(m, l, o)`` with a key/value block."""
    m, den, o = carry  # running max, softmax denominator l, unnormalised output
    s = _scores(q, k, q_pos, k_pos, causal, scale)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # fully masked so far: keep finite
    pr = jnp.exp(s - m_safe[..., None])  # masked entries -> exp(-inf) = 0
    alpha = jnp.exp(m - m_safe)  # m = -inf -> 0
    l_new = alpha * den + jnp.sum(pr, axis=-1)
    pv = grouped_values(pr.astype(v.dtype), v)
    o_new = jnp.transpose(alpha, (0, 2, 1))[..., None] * o + pv
    return m_new, l_new, o_new


def _forward(axis_name, causal, q, k, v, q_pos, k_pos):
    p = jax.lax.axis_size(axis_name)
    scale = q.shape[-1] ** -0.5
    b, sq, a, d = q.shape
    # Step 0 (own block) outside the loop: the carries then derive from q, k, v and carry the
    # same varying-manual-axes type as the loop body's outputs.
    m0 = jnp.full((b, a, sq), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((b, a, sq), jnp.float32)
    o0 = jnp.zeros((b, sq, a, d), jnp.float32)
    m, den, o = online_softmax_block((m0, l0, o0), q, k, v, q_pos, k_pos, causal, scale)

    def step(_, carry):
        k_t, v_t, kp_t, m, den, o = carry
        k_t, v_t, kp_t = ring_shift((k_t, v_t, kp_t), axis_name, p)
        m, den, o = online_softmax_block((m, den, o), q, k_t, v_t, q_pos, kp_t, causal, scale)
        return k_t, v_t, kp_t, m, den, o

    _, _, _, m, den, o = jax.lax.fori_loop(0, p - 1, step, (k, v, k_pos, m, den, o))
    has_key = den > 0
    l_safe = jnp.where(has_key, den, 1.0)
    out = o / jnp.transpose(l_safe, (0, 2, 1))[..., None]  # fully masked rows: o = 0 -> 0
    # finite lse for fully masked rows (their P is 0 in backward through the mask)
    lse = jnp.where(has_key, m + jnp.log(l_safe), 0.0)
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(axis_name, causal, q, k, v, q_pos, k_pos):
    out, _ = _forward(axis_name, causal, q, k, v, q_pos, k_pos)
    return out


def _ring_fwd(axis_name, causal, q, k, v, q_pos, k_pos):
    out, lse = _forward(axis_name, causal, q, k, v, q_pos, k_pos)
    out, lse = checkpoint_name(out, RING_RESIDUAL), checkpoint_name(lse, RING_RESIDUAL)
    return out, (q, k, v, q_pos, k_pos, out, lse)


def block_grads(q, k, v, q_pos, k_pos, do, delta, lse, causal, scale):
    """Gradient contributions ``(dq, dk, dv)`` (float32) of one key/value block."""
    s = _scores(q, k, q_pos, k_pos, causal, scale)
    pr = jnp.exp(s - lse[..., None])  # [b, a, q, k]; masked -> 0
    g = k.shape[2]
    dv = grouped_key_grad(pr, do, g)
    dp = grouped_scores(do, v)
    ds = pr * (dp - delta[..., None]) * scale
    dq = grouped_values(ds, k)
    dk = grouped_key_grad(ds, q, g)
    return dq, dk, dv


def _ring_bwd(axis_name, causal, res, g):
    q, k, v, q_pos, k_pos, out, lse = res
    p = jax.lax.axis_size(axis_name)
    scale = q.shape[-1] ** -0.5
    do = g.astype(jnp.float32)
    qf = q.astype(jnp.float32)
    # D = rowsum(dO * O), laid out like lse: [b, a, sq]
    delta = jnp.transpose(jnp.sum(do * out.astype(jnp.float32), axis=-1), (0, 2, 1))
    # k, v travel in their own dtype (half the bytes of float32 under bf16); dK, dV in float32
    dq, dk, dv = block_grads(qf, k, v, q_pos, k_pos, do, delta, lse, causal, scale)

    def step(_, carry):
        k_t, v_t, kp_t, dk_t, dv_t, dq = carry
        # the key block and its travelling gradient move together, one hop
        k_t, v_t, kp_t, dk_t, dv_t = ring_shift((k_t, v_t, kp_t, dk_t, dv_t), axis_name, p)
        dq_i, dk_i, dv_i = block_grads(qf, k_t, v_t, q_pos, kp_t, do, delta, lse, causal, scale)
        return k_t, v_t, kp_t, dk_t + dk_i, dv_t + dv_i, dq + dq_i

    _, _, _, dk, dv, dq = jax.lax.fori_loop(0, p - 1, step, (k, v, k_pos, dk, dv, dq))
    # the p-th hop brings each key block's gradient home (k, v themselves need not travel)
    dk, dv = ring_shift((dk, dv), axis_name, p)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_ring.defvjp(_ring_fwd, _ring_bwd)
