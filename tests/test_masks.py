"""Attention masks chosen by the model: ``causal`` on or off, and padding (negative positions)
masked as keys in every kernel, against a plain single-device softmax with an explicit mask; the
sequence kernels run grouped-query attention (2 key/value heads for 4 query heads) at once."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from colossal_jax.config import ConfigError, ParallelConfig
from colossal_jax.config.parallel_rules import check_seq_split, uses_zigzag
from colossal_jax.layers.rope import apply_rope, with_rope
from colossal_jax.sequence.fused import fused_attention
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.sequence.ring import ring_attention
from colossal_jax.sequence.ring_self_attention import ring_self_attention
from colossal_jax.sequence.ulysses import ulysses_attention
from colossal_jax.sequence.zigzag import zigzag_permutation
from tests.test_sequence_kernels import _sharded

TOL = dict(rtol=1e-5, atol=1e-5)
B, S, A, D, KV = 3, 16, 4, 8, 2


def padded_positions(s: int = S) -> jnp.ndarray:
    """Row 0: no padding; row 1: 5 trailing pads; row 2: 3 leading pads (positions -1)."""
    pad = -np.ones(5)
    rows = [np.arange(s), np.r_[np.arange(s - 5), pad], np.r_[pad[:3], np.arange(s - 3)]]
    return jnp.asarray(np.stack(rows), jnp.int32)


def plain_attention(q, k, v, pos, causal: bool):
    """The definition, written independently of the kernels: mask ``[b, sq, sk]`` from the
    positions, softmax over the visible keys, zero rows where no key is visible."""
    mask = (pos[:, None, :] >= 0) & (
        (pos[:, None, :] <= pos[:, :, None]) if causal else jnp.ones((1, 1, 1), bool)
    )
    scores = jnp.einsum("bqad,bkad->baqk", q, k) / np.sqrt(q.shape[-1])
    scores = jnp.where(mask[:, None], scores, -1e30)
    out = jnp.einsum("baqk,bkad->bqad", jax.nn.softmax(scores, axis=-1), v)
    any_key = jnp.any(mask, axis=-1)[:, :, None, None]
    return jnp.where(any_key, out, 0.0)


def _inputs(seed=0, kv=A):
    keys = jax.random.split(jax.random.key(seed), 4)
    q, ct = (jax.random.normal(key, (B, S, A, D), jnp.float32) for key in keys[:2])
    k, v = (jax.random.normal(key, (B, S, kv, D), jnp.float32) for key in keys[2:])
    return q, k, v, ct


def _compare(fn, causal: bool, order=None, kv=A):
    """``fn(q, k, v, pos, pos)`` (on tokens permuted by ``order``; ``kv`` key/value heads)
    equals the plain masked attention on key/value heads repeated to ``A``, forward and
    gradients; padding keys get exactly zero gradient."""
    q, k, v, ct = _inputs(kv=kv)
    pos = padded_positions()
    order = np.arange(S) if order is None else order
    inv = np.argsort(order)

    def got(q, k, v):
        out = fn(q[:, order], k[:, order], v[:, order], pos[:, order], pos[:, order])
        return out[:, inv]

    def want(q, k, v):
        k, v = jnp.repeat(k, A // kv, axis=2), jnp.repeat(v, A // kv, axis=2)
        return plain_attention(q, k, v, pos, causal)

    @jax.jit  # one compile: both outputs and both pullbacks
    def run(q, k, v):
        out, pull = jax.vjp(got, q, k, v)
        ref, ref_pull = jax.vjp(want, q, k, v)
        return out, ref, pull(ct), ref_pull(ct)

    out, ref, g_got, g_want = run(q, k, v)
    np.testing.assert_allclose(out, ref, **TOL)
    for g, w in zip(g_got, g_want, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, **TOL)
    # a padding key gets no gradient: nothing attended to it
    np.testing.assert_array_equal(g_got[1][1, S - 5 :], 0.0)
    np.testing.assert_array_equal(g_got[2][2, :3], 0.0)


def test_local_attention_masks_padding():
    """Causal; the bidirectional local kernel runs in tests/test_layer_contract.py."""
    _compare(functools.partial(dot_product_attention, causal=True), True, kv=KV)


P_SEQ = 4


@pytest.mark.parametrize(
    "kernel,causal,zigzag",
    [
        (ring_attention, True, True),
        (ring_attention, False, False),
        (ulysses_attention, True, False),
        (ring_self_attention, False, False),
    ],
    ids=["ring-zigzag-causal", "ring-bidirectional", "ulysses-causal", "rsa-bidirectional"],
)
def test_sequence_kernels_mask_padding_with_gqa(kernel, causal, zigzag):
    """2 key/value heads for 4 query heads; Ulysses at p=4 repeats them to 4 before its
    all-to-all."""
    order = zigzag_permutation(S, P_SEQ) if zigzag else None
    _compare(_sharded(kernel, P_SEQ, causal), causal, order, kv=KV)


def test_fused_call_with_trailing_padding_matches_reference():
    """The cuDNN call (index-causal plus per-row key lengths), run by jax.nn's XLA
    implementation of the same call, equals the position-masked reference for trailing padding:
    the exact case the fused path documents (rows 0 and 1 of :func:`padded_positions`)."""
    q, k, v, _ = _inputs(1)
    pos = padded_positions()[:2]
    q, k, v = q[:2], k[:2], v[:2]
    lengths = jnp.sum(pos >= 0, axis=1, dtype=jnp.int32)

    @jax.jit
    def run(q, k, v):
        return [
            (
                plain_attention(q, k, v, pos, causal),
                jax.nn.dot_product_attention(
                    q, k, v, is_causal=causal, key_value_seq_lengths=lengths, implementation="xla"
                ),
                fused_attention(q, k, v, pos, pos, causal=causal),
            )
            for causal in (True, False)
        ]

    real = np.asarray(pos >= 0)  # padding queries may differ: their outputs are unused
    for ref, call, fused in run(q, k, v):
        np.testing.assert_allclose(np.asarray(call)[real], np.asarray(ref)[real], **TOL)
        np.testing.assert_allclose(fused, ref, **TOL)


def test_rope_treats_padding_as_position_zero_and_keeps_the_mask():
    q, k, v, _ = _inputs(2)
    pos = padded_positions()
    clamped = jnp.maximum(pos, 0)

    @jax.jit
    def run(q, k, v):
        got = with_rope(dot_product_attention)(q, k, v, pos, pos, causal=False)
        rotated = apply_rope(q, clamped), apply_rope(k, clamped)
        return got, plain_attention(*rotated, v, pos, causal=False)

    got, want = run(q, k, v)
    np.testing.assert_allclose(got, want, **TOL)


class _Bidirectional:
    causal = False


def test_zigzag_only_for_causal_models():
    """Zigzag balances the causal mask's work; a bidirectional model keeps the plain ring and
    needs seq_len divisible by seq only."""
    ring = ParallelConfig(seq=4, seq_mode="ring")
    assert uses_zigzag(ring, object())  # GPT-style configs declare nothing: causal
    assert not uses_zigzag(ring, _Bidirectional())
    assert not uses_zigzag(ParallelConfig(seq=4, seq_mode="ulysses"), object())
    check_seq_split(20, 4, zigzag=uses_zigzag(ring, _Bidirectional()))
    with pytest.raises(ConfigError, match=r"--seq-len 20 .*2\*p=8"):
        check_seq_split(20, 4, zigzag=uses_zigzag(ring, object()))
