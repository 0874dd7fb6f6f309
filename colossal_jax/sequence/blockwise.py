"""Blockwise (flash-style) attention on one device, in plain JAX: ``--attention blockwise``.

Algorithm: the blockwise online softmax of FlashAttention (Dao et al. 2022, "FlashAttention:
Fast and Memory-Efficient Exact Attention with IO-Awareness", arXiv 2205.14135; Milakov &
Gimelshein 2018, "Online normalizer calculation for softmax", arXiv 1805.02867) and the
memory-efficient attention of Rabe & Staats 2021 ("Self-attention Does Not Need O(n²) Memory",
arXiv 2112.05682): the keys and values are cut into blocks of ``B`` tokens and a ``lax.scan``
folds each block's scores into running ``(m, l, o)`` in float32, so the ``[s, s]`` score
matrix is never built. It is ring attention (:mod:`colossal_jax.sequence.ring`) on a ring of
one device, with the blocks taken from the local sequence instead of arriving over a link, and
it shares that kernel's block updates and its position masks (padding, causal;
:mod:`colossal_jax.sequence.local`), grouped-query heads included.

Backward is a ``jax.custom_vjp``: residuals ``q, k, v, positions, out, lse`` (``out`` and ``lse``
named :data:`~colossal_jax.sequence.ring.RING_RESIDUAL`, which the remat policies ``dots`` and
``selective`` keep); a second scan over the key blocks recomputes each block's probabilities
from ``lse``, adds its ``dQ`` and emits its ``dK, dV``.

Where it runs: anywhere the fused kernel would (no sequence split, or Ulysses), on any backend,
any precision. On a GPU cuDNN's kernel is faster; this one is for the backends that have no
fused kernel (the simulated CPU devices, where ``scripts/plan.py --verify`` compiles a GPU plan
with it so the CPU compile holds what cuDNN holds) and for long sequences in fp32.

Per-device cost (``n = b·s`` tokens, ``a`` heads of ``d``, ``h = a·d``): communication none;
memory one ``[b, a, s, B]`` float32 score block at a time (``a·B`` per token while it runs,
none kept), the running ``m, l: [b, a, s]`` and ``o: [b, s, a, d]`` in float32, and residuals
``q, k, v, out`` plus ``lse``; FLOPs those of attention (``4·n·s·h``) forward and twice that
backward plus the scores' recomputation (``2·n·s·h``), as FlashAttention.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from colossal_jax.sequence.ring import RING_RESIDUAL, block_grads, online_softmax_block

BLOCK = 128
"""The most key tokens one score block holds (the largest divisor of the sequence length up to
this is used)."""


def block_size(seq_len: int, most: int = BLOCK) -> int:
    """The key block length for a sequence of ``seq_len`` keys: its largest divisor that is at
    most ``most`` (the whole sequence when it is that short)."""
    return max(b for b in range(1, min(seq_len, most) + 1) if seq_len % b == 0)


def blockwise_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    k_pos: jax.Array,
    *,
    causal: bool = True,
    block: int = BLOCK,
) -> jax.Array:
    """Softmax attention of ``q: [b, sq, a, d]`` over ``k, v: [b, sk, g, d]`` (``g`` dividing
    ``a``), masked by the integer positions ``[b, s*]`` (negative: padding), computed one key
    block of at most ``block`` tokens at a time (see the module). Equal to
    :func:`colossal_jax.sequence.local.dot_product_attention`; the result has ``q``'s dtype."""
    return _blockwise(causal, block_size(k.shape[1], block), q, k, v, q_pos, k_pos)


def _blocks(x: jax.Array, size: int) -> jax.Array:
    """``[b, s, …]`` as ``[s/size, b, size, …]``: the key blocks, leading, for a scan."""
    b, s = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, s // size, size, *x.shape[2:]), 1, 0)


def _unblocks(x: jax.Array) -> jax.Array:
    """The inverse of :func:`_blocks`."""
    n, b, size = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, n * size, *x.shape[3:])


def _forward(causal, size, q, k, v, q_pos, k_pos):
    scale = q.shape[-1] ** -0.5
    b, sq, a, d = q.shape
    m0 = jnp.full((b, a, sq), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((b, a, sq), jnp.float32)
    o0 = jnp.zeros((b, sq, a, d), jnp.float32)

    def step(carry, block):
        k_i, v_i, kp_i = block
        return online_softmax_block(carry, q, k_i, v_i, q_pos, kp_i, causal, scale), None

    ks, vs, kps = _blocks(k, size), _blocks(v, size), _blocks(k_pos, size)
    # the first block outside the scan: the carries then derive from q, k, v and have the
    # loop body's varying-manual-axes type inside a shard_map (as the ring's first step)
    carry, _ = step((m0, l0, o0), (ks[0], vs[0], kps[0]))
    (m, den, o), _ = jax.lax.scan(step, carry, (ks[1:], vs[1:], kps[1:]))
    has_key = den > 0
    l_safe = jnp.where(has_key, den, 1.0)
    out = o / jnp.transpose(l_safe, (0, 2, 1))[..., None]  # rows with no visible key: 0
    lse = jnp.where(has_key, m + jnp.log(l_safe), 0.0)
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _blockwise(causal, size, q, k, v, q_pos, k_pos):
    return _forward(causal, size, q, k, v, q_pos, k_pos)[0]


def _blockwise_fwd(causal, size, q, k, v, q_pos, k_pos):
    out, lse = _forward(causal, size, q, k, v, q_pos, k_pos)
    out, lse = checkpoint_name(out, RING_RESIDUAL), checkpoint_name(lse, RING_RESIDUAL)
    return out, (q, k, v, q_pos, k_pos, out, lse)


def _blockwise_bwd(causal, size, res, g):
    q, k, v, q_pos, k_pos, out, lse = res
    scale = q.shape[-1] ** -0.5
    do = g.astype(jnp.float32)
    qf = q.astype(jnp.float32)
    delta = jnp.transpose(jnp.sum(do * out.astype(jnp.float32), axis=-1), (0, 2, 1))

    def grads(block):
        k_i, v_i, kp_i = block
        return block_grads(qf, k_i, v_i, q_pos, kp_i, do, delta, lse, causal, scale)

    def step(dq, block):
        dq_i, dk_i, dv_i = grads(block)
        return dq + dq_i, (dk_i, dv_i)

    ks, vs, kps = _blocks(k, size), _blocks(v, size), _blocks(k_pos, size)
    dq, dk0, dv0 = grads((ks[0], vs[0], kps[0]))  # outside the scan, as in the forward
    dq, (dk, dv) = jax.lax.scan(step, dq, (ks[1:], vs[1:], kps[1:]))
    dk = _unblocks(jnp.concatenate([dk0[None], dk]))
    dv = _unblocks(jnp.concatenate([dv0[None], dv]))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)
