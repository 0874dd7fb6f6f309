"""Dynamic loss scaling: skipped overflow steps, growth/back-off, exact unscaling, jit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from colossal_jax.training.loss_scale import (
    DynamicScale,
    init_scale,
    scale_loss,
    select_if_finite,
    unscale_and_check,
    update_scale,
)


def _problem(dtype=jnp.float32):
    kw, kb, kx, ky = jax.random.split(jax.random.key(0), 4)
    params = {
        "w": 0.1 * jax.random.normal(kw, (4, 3), jnp.float32),
        "b": 0.1 * jax.random.normal(kb, (3,), jnp.float32),
    }
    x = jax.random.normal(kx, (8, 4), jnp.float32)
    y = 0.1 * jax.random.normal(ky, (8, 3), jnp.float32)
    return params, x, y


def _loss(params, x, y, mult, compute=jnp.float16):
    """A linear layer in ``compute`` precision (fp32 master weights); mse times ``mult`` in fp32."""
    w, b = params["w"].astype(compute), params["b"].astype(compute)
    out = x.astype(compute) @ w + b
    err = out.astype(jnp.float32) - y
    return jnp.mean(err**2) * mult


def _step(params, opt_state, ls, x, y, mult, tx, **scale_kw):
    loss, grads = jax.value_and_grad(lambda p: scale_loss(ls, _loss(p, x, y, mult)))(params)
    grads, finite = unscale_and_check(ls, grads)
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    params, opt_state = select_if_finite(finite, (new_params, new_opt), (params, opt_state))
    return params, opt_state, update_scale(ls, finite, **scale_kw), loss / ls.scale, finite


def _assert_trees_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_overflow_step_is_skipped_then_recovers():
    params, x, y = _problem()
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    ls = init_scale()  # 2**15
    # The scaled cotangent (~2**15 · 1e5 · 2·err/24) overflows when cast back to fp16.
    p1, o1, ls1, _, finite = _step(params, opt_state, ls, x, y, 1e5, tx)
    assert not bool(finite)
    assert float(ls1.scale) == 2.0**14
    assert int(ls1.skipped) == 1 and int(ls1.good_steps) == 0
    _assert_trees_equal(p1, params)
    _assert_trees_equal(o1, opt_state)

    p2, o2, ls2, loss, finite = _step(p1, o1, ls1, x, y, 1.0, tx)
    assert bool(finite) and np.isfinite(float(loss))
    assert float(ls2.scale) == 2.0**14 and int(ls2.good_steps) == 1 and int(ls2.skipped) == 1
    for new, old in zip(jax.tree.leaves(p2), jax.tree.leaves(params), strict=True):
        assert np.all(np.isfinite(np.asarray(new)))
        assert not np.array_equal(np.asarray(new), np.asarray(old))
    assert int(o2[0].count) == 1


def test_growth_backoff_and_floor():
    ls = init_scale(8.0)
    yes, no = jnp.asarray(True), jnp.asarray(False)
    for expected_good in (1, 2):
        ls = update_scale(ls, yes, growth_interval=3)
        assert float(ls.scale) == 8.0 and int(ls.good_steps) == expected_good
    ls = update_scale(ls, yes, growth_interval=3)
    assert float(ls.scale) == 16.0 and int(ls.good_steps) == 0
    ls = update_scale(ls, yes, growth_interval=3)
    ls = update_scale(ls, no, growth_interval=3)
    assert float(ls.scale) == 8.0 and int(ls.good_steps) == 0 and int(ls.skipped) == 1
    for _ in range(5):
        ls = update_scale(ls, no, growth_interval=3, min_scale=2.0)
    assert float(ls.scale) == 2.0 and int(ls.skipped) == 6
    # the cap keeps the scale finite
    big = update_scale(init_scale(2.0**32), yes, growth_interval=1)
    assert float(big.scale) == 2.0**32
    # dtypes stay put (a fixed-structure pytree for checkpoints and jit carries)
    assert isinstance(ls, DynamicScale)
    assert (ls.scale.dtype, ls.good_steps.dtype, ls.skipped.dtype) == (
        jnp.float32,
        jnp.int32,
        jnp.int32,
    )


def test_unscaled_grads_match_fp32_grads():
    params, x, y = _problem()
    ls = init_scale(2.0**10)

    def loss(p):
        return _loss(p, x, y, 1.0, compute=jnp.float32)

    ref = jax.grad(loss)(params)
    scaled = jax.grad(lambda p: scale_loss(ls, loss(p)))(params)
    got, finite = unscale_and_check(ls, scaled)
    assert bool(finite)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-6, atol=0)


def test_whole_step_jits_and_matches_eager():
    params, x, y = _problem()
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    ls = init_scale()

    def run(step):
        state = (params, opt_state, ls)
        out = []
        for mult in (1e5, 1.0, 1.0, 1e5, 1.0):  # skip, step, step (grow), skip, step
            p, o, s, loss, finite = step(*state, x, y, mult)
            state = (p, o, s)
            out.append((state, loss, finite))
        return out

    def step(p, o, s, x, y, mult):
        return _step(p, o, s, x, y, mult, tx, growth_interval=2)

    eager, jitted = run(step), run(jax.jit(step))
    for (se, le, fe), (sj, lj, fj) in zip(eager, jitted, strict=True):
        assert bool(fe) == bool(fj)
        np.testing.assert_allclose(float(le), float(lj), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(se), jax.tree.leaves(sj), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    final = jitted[-1][0][2]
    assert [bool(f) for _, _, f in jitted] == [False, True, True, False, True]
    assert float(final.scale) == 2.0**14 and int(final.skipped) == 2 and int(final.good_steps) == 1
