"""Blockwise attention (``--attention blockwise``) equals the reference on one device, forward
and gradients, and never holds the whole score matrix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from colossal_jax.sequence.blockwise import block_size, blockwise_attention
from colossal_jax.sequence.local import dot_product_attention

TOL = dict(rtol=1e-5, atol=1e-5)


def _inputs(b, s, a, g, d, seed=0):
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(kq, (b, s, a, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, g, d), jnp.float32)
    v = jax.random.normal(kv, (b, s, g, d), jnp.float32)
    ct = jax.random.normal(kc, (b, s, a, d), jnp.float32)
    return q, k, v, ct


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("s", "block", "g"), [(24, 8, 4), (24, 5, 2), (16, 64, 1)])
def test_blockwise_matches_the_reference_with_padding_and_grouped_heads(causal, s, block, g):
    b, a, d = 2, 4, 8
    q, k, v, ct = _inputs(b, s, a, g, d)
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    pos = pos.at[1, s - 5 :].set(-1)  # trailing padding in the second row

    def loss(f, q, k, v):
        return jnp.sum(f(q, k, v, pos, pos, causal=causal) * ct)

    def blockwise(q, k, v, qp, kp, causal):
        return blockwise_attention(q, k, v, qp, kp, causal=causal, block=block)

    want = dot_product_attention(q, k, v, pos, pos, causal=causal)
    got = blockwise(q, k, v, pos, pos, causal)
    np.testing.assert_allclose(got, want, **TOL)
    g_want = jax.grad(lambda *x: loss(dot_product_attention, *x), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.grad(lambda *x: loss(blockwise, *x), argnums=(0, 1, 2))(q, k, v)
    for x, y in zip(g_got, g_want, strict=True):
        np.testing.assert_allclose(x, y, **TOL)


def test_block_size_is_the_largest_divisor_up_to_the_limit():
    assert block_size(2048) == 128
    assert block_size(24, 5) == 4
    assert block_size(7, 512) == 7
    assert block_size(13, 4) == 1


def test_blockwise_holds_one_score_block_not_the_matrix():
    # forward + backward at s = 1024: the reference's temporaries hold [b, a, s, s] scores
    # (and their gradient); blockwise a few [b, a, s, 128] blocks (probabilities, their
    # gradient) of one step at a time: less than one score matrix
    b, s, a, d = 1, 1024, 4, 16
    q, k, v, ct = _inputs(b, s, a, a, d)
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))

    def temp(f):
        step = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2)))
        return step.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

    scores = 4 * b * a * s * s
    full = temp(lambda q, k, v: dot_product_attention(q, k, v, pos, pos))
    blocked = temp(lambda q, k, v: blockwise_attention(q, k, v, pos, pos, block=128))
    assert full > scores, (full, scores)
    assert blocked < scores and full > 4 * blocked, (blocked, scores, full)
