"""RoPE from explicit positions, and the choice of the fused attention kernel."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from colossal_jax.layers.rope import apply_rope, with_rope
from colossal_jax.sequence.fused import fused_attention, resolve
from colossal_jax.sequence.local import dot_product_attention
from tests.helpers import losses, tiny_config


def test_rope_scores_depend_only_on_relative_position():
    q = jax.random.normal(jax.random.key(0), (1, 1, 1, 8))
    k = jax.random.normal(jax.random.key(1), (1, 1, 1, 8))

    def score(m, n):
        pm, pn = jnp.full((1, 1), m), jnp.full((1, 1), n)
        return jnp.sum(apply_rope(q, pm) * apply_rope(k, pn))

    np.testing.assert_allclose(score(5, 2), score(103, 100), rtol=1e-5)
    np.testing.assert_allclose(score(0, 0), jnp.sum(q * k), rtol=1e-6)
    assert not np.isclose(score(5, 2), score(2, 5))


def test_rope_attention_is_invariant_to_token_order():
    """Permuting tokens together with their positions permutes the output (zigzag safety)."""
    b, s, a, d = 2, 8, 2, 4
    q, k, v = (jax.random.normal(jax.random.key(i), (b, s, a, d)) for i in range(3))
    pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    attn = with_rope(functools.partial(dot_product_attention, causal=True))
    order = np.array([0, 7, 1, 6, 2, 5, 3, 4])
    ref = attn(q, k, v, pos, pos)
    got = attn(q[:, order], k[:, order], v[:, order], pos[:, order], pos[:, order])
    np.testing.assert_allclose(got, ref[:, order], rtol=1e-5, atol=1e-6)


def test_rope_model_with_ring_matches_data_parallel():
    base = tiny_config(steps=4, batch_size=8, seq_len=32, devices=8, data=8)
    over = dict(base.model_overrides, position="rope")
    want = losses(dataclasses.replace(base, model_overrides=over))
    ring = tiny_config(steps=4, batch_size=8, seq_len=32, devices=8, data=2, seq=4, seq_mode="ring")
    got = losses(dataclasses.replace(ring, model_overrides=over))
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_resolve_fused_kernel():
    assert resolve("auto", jnp.bfloat16, backend="gpu") == "cudnn"
    assert resolve("auto", jnp.float32, backend="gpu") == "xla"
    assert resolve("auto", jnp.bfloat16, backend="cpu") == "xla"
    assert resolve("xla", jnp.bfloat16, backend="gpu") == "xla"
    for backend in ("cpu", "gpu"):
        assert resolve("blockwise", jnp.float32, backend=backend) == "blockwise"
    with pytest.raises(ValueError, match="needs a GPU"):
        resolve("cudnn", jnp.bfloat16, backend="cpu")
    with pytest.raises(ValueError, match="bf16 or fp16"):
        resolve("cudnn", jnp.float32, backend="gpu")
    with pytest.raises(ValueError, match="not one of"):
        resolve("flash", jnp.float32)


def test_fused_call_semantics_match_reference():
    """The fused path's call (index-causal, [b, s, a, d]) equals the position-masked reference
    for in-order positions; checked with jax.nn's XLA implementation of the same call."""
    b, s, a, d = 2, 16, 4, 8
    q, k, v = (jax.random.normal(jax.random.key(i), (b, s, a, d)) for i in range(3))
    pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    ref = dot_product_attention(q, k, v, pos, pos, causal=True)
    xla = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_allclose(xla, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused_attention(q, k, v, pos, pos), ref, rtol=1e-6)


@pytest.mark.parametrize("kernel", ["cudnn", "blockwise"])
def test_fused_kernels_are_refused_where_they_would_have_no_effect(kernel):
    from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig

    for mode in ("ring", "ring-self-attention"):
        cfg = TrainConfig(attention=kernel, parallel=ParallelConfig(seq=2, seq_mode=mode))
        with pytest.raises(ConfigError, match=f"--attention {kernel} cannot run inside"):
            cfg.validate()
    TrainConfig(attention=kernel, parallel=ParallelConfig(seq=2, seq_mode="ulysses")).validate()


@pytest.mark.parametrize("par", [dict(data=8), dict(data=2, seq=4, seq_mode="ulysses")])
def test_blockwise_attention_trains_the_reference_curve(par):
    # --attention blockwise reaches the model's attention (no split, and inside Ulysses) and
    # gives the XLA reference's losses
    base = tiny_config(steps=3, batch_size=8, seq_len=32, devices=8, **par)
    want = losses(base)
    got = losses(dataclasses.replace(base, attention="blockwise"))
    np.testing.assert_allclose(got, want, rtol=1e-5)
