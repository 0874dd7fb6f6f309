"""Sequence-parallel attention kernels match single-device attention (forward and gradients)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.sequence.ring import ring_attention
from colossal_jax.sequence.ring_self_attention import ring_self_attention
from colossal_jax.sequence.ulysses import ulysses_attention
from colossal_jax.sequence.zigzag import (
    block_schedule,
    unmasked_blocks_per_device,
    zigzag_permutation,
)

TOL = dict(rtol=1e-5, atol=1e-5)
KERNELS = {
    "ring": ring_attention,
    "ulysses": ulysses_attention,
    "ring_self_attention": ring_self_attention,
}


def _inputs(b, s, a, d, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v, ct = (jax.random.normal(key, (b, s, a, d), jnp.float32) for key in keys)
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    return q, k, v, ct, pos


def _sharded(kernel, p, causal):
    mesh = Mesh(np.array(jax.devices()[:p]), ("seq",))
    x, t = P(None, "seq"), P(None, "seq")
    return jax.shard_map(
        functools.partial(kernel, axis_name="seq", causal=causal),
        mesh=mesh,
        in_specs=(x, x, x, t, t),
        out_specs=x,
    )


def _check(kernel, p, causal, b, s, a, d, order=None):
    q, k, v, ct, pos = _inputs(b, s, a, d)
    f = _sharded(kernel, p, causal)
    if order is None:
        order = np.arange(s)
    inv = np.argsort(order)

    def parallel(q, k, v):  # permute, shard, attend, un-permute
        out = f(q[:, order], k[:, order], v[:, order], pos[:, order], pos[:, order])
        return out[:, inv]

    def reference(q, k, v):
        return dot_product_attention(q, k, v, pos, pos, causal=causal)

    np.testing.assert_allclose(jax.jit(parallel)(q, k, v), reference(q, k, v), **TOL)

    def loss(fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * ct), argnums=(0, 1, 2)))

    for got, want in zip(loss(parallel)(q, k, v), loss(reference)(q, k, v), strict=True):
        np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize(
    "p,s,causal",
    [(2, 16, True), (4, 32, False), (4, 24, True), (8, 32, True)],
)
def test_ring_attention_zigzag_matches_reference(p, s, causal):
    # s=24, p=4: chunks of 3 tokens, so each device's two chunks differ in masked content
    _check(ring_attention, p, causal, b=2, s=s, a=4, d=8, order=zigzag_permutation(s, p))


def test_ring_attention_contiguous_order_matches_reference():
    _check(ring_attention, 4, True, b=2, s=16, a=4, d=8)


@pytest.mark.parametrize("p,causal", [(2, True), (4, False), (8, True)])
def test_ulysses_matches_reference(p, causal):
    _check(ulysses_attention, p, causal, b=2, s=16, a=8 if p == 8 else 4, d=8)


@pytest.mark.parametrize("p,causal", [(2, False), (4, True), (8, True)])
def test_ring_self_attention_matches_reference(p, causal):
    _check(ring_self_attention, p, causal, b=2, s=16, a=4, d=8)


def test_ulysses_rejects_indivisible_heads():
    with pytest.raises(ValueError, match=r"heads per tensor shard \(4\).*p=8"):
        _check(ulysses_attention, 8, True, b=1, s=16, a=4, d=8)


def test_zigzag_permutation_layout_and_errors():
    order = zigzag_permutation(16, 4)  # chunks of 2: device i gets chunks i and 7 - i
    assert order.tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert sorted(order.tolist()) == list(range(16))
    with pytest.raises(ValueError, match=r"--seq-len 20 .*2\*p=8.*16 or 24"):
        zigzag_permutation(20, 4)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zigzag_schedule_is_balanced(p):
    s = 2 * p * 3
    zig = unmasked_blocks_per_device(s, p, zigzag=True)
    flat = unmasked_blocks_per_device(s, p, zigzag=False)
    assert zig.max() - zig.min() <= 1
    np.testing.assert_array_equal(zig, np.full(p, 2 * p + 1))
    np.testing.assert_array_equal(flat, 4 * np.arange(p) + 3)
    assert flat.max() - flat.min() == 4 * (p - 1) > 1
    assert block_schedule(s, p).shape == (p, p)
    # both orders do the same total work: every unmasked chunk pair is counted once
    assert zig.sum() == flat.sum() == (2 * p) * (2 * p + 1) // 2


def test_ring_attention_grad_hlo_is_blockwise():
    p, b, s, a, d = 8, 2, 64, 4, 8
    q, k, v, ct, pos = _inputs(b, s, a, d)
    f = _sharded(ring_attention, p, True)

    def grad_of(fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, pos, pos) * ct), (0, 1, 2)))

    hlo = grad_of(f).lower(q, k, v).compile().as_text()
    assert "collective-permute" in hlo
    full = re.compile(rf"f32\[[0-9,]*\b{s},{s}\]")  # any [..., s, s] float32 array
    assert not full.search(hlo), "ring attention built a full [s, s] score matrix"
    # the pattern does catch the single-device reference's [b, a, s, s] scores
    reference = functools.partial(dot_product_attention, causal=True)
    assert full.search(grad_of(reference).lower(q, k, v).compile().as_text())
