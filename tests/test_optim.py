"""LAMB and LARS against hand-written steps from the papers (docs/formulas.md), and their masks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from colossal_jax.config import OptimConfig
from colossal_jax.training.optim import make_optimizer, schedule


def _params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k1, (4, 3)),
        "b": jax.random.normal(k2, (3,)),
    }, {"w": jax.random.normal(k3, (4, 3)), "b": jnp.full((3,), 0.5)}


def _cfg(name, **kw):
    return OptimConfig(
        name=name, lr=0.1, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.01, clip_norm=0.0, **kw
    )


def test_lamb_matches_paper_step():
    params, grads = _params()
    cfg = _cfg("lamb")
    tx = make_optimizer(cfg, total_steps=10)
    updates, _ = tx.update(grads, tx.init(params), params)
    b1, b2, eps, lam, lr = cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, cfg.lr
    for name in ("w", "b"):
        g, w = np.asarray(grads[name]), np.asarray(params[name])
        m_hat = (1 - b1) * g / (1 - b1)
        v_hat = (1 - b2) * g * g / (1 - b2)
        r = m_hat / (np.sqrt(v_hat) + eps)
        if name == "w":  # matrices: weight decay and trust ratio
            r = r + lam * w
            r = np.linalg.norm(w) / np.linalg.norm(r) * r
        np.testing.assert_allclose(updates[name], -lr * r, rtol=1e-5, atol=1e-7)


def test_lars_uses_the_paper_denominator():
    params, grads = _params()
    cfg = _cfg("lars")
    tx = make_optimizer(cfg, total_steps=10)
    updates, _ = tx.update(grads, tx.init(params), params)
    lam, trust, lr = cfg.weight_decay, cfg.lars_trust, cfg.lr
    g, w = np.asarray(grads["w"]), np.asarray(params["w"])
    local = trust * np.linalg.norm(w) / (np.linalg.norm(g) + lam * np.linalg.norm(w))
    np.testing.assert_allclose(updates["w"], -lr * local * (g + lam * w), rtol=1e-5)
    # excluded (bias): plain momentum SGD on the gradient
    np.testing.assert_allclose(updates["b"], -lr * np.asarray(grads["b"]), rtol=1e-6)
    # and it differs from optax.lars, whose denominator is ‖g + λw‖
    ref = optax.lars(lr, weight_decay=lam, trust_coefficient=trust, momentum=cfg.b1)
    theirs, _ = ref.update(grads, ref.init(params), params)
    assert not np.allclose(theirs["w"], updates["w"])


@pytest.mark.parametrize("name", ["adamw", "lamb", "lars", "sgd"])
def test_every_optimizer_reduces_a_quadratic(name):
    target = jnp.arange(12.0).reshape(4, 3) / 10
    params = {"w": jnp.zeros((4, 3)) + 0.1}
    cfg = dataclasses.replace(_cfg(name), weight_decay=0.0, lr=0.5 if name == "lars" else 0.05)
    if name == "lars":
        cfg = dataclasses.replace(cfg, lars_trust=1.0)
    tx = make_optimizer(cfg, total_steps=50)
    state = tx.init(params)
    loss = lambda p: jnp.sum((p["w"] - target) ** 2)
    first = loss(params)
    for _ in range(50):
        g = jax.grad(loss)(params)
        upd, state = tx.update(g, state, params)
        params = optax.apply_updates(params, upd)
    assert loss(params) < 0.5 * first


def test_schedule_warms_up_then_decays():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lr = schedule(cfg, 100)
    assert float(lr(0)) == 0.0 and float(lr(10)) == pytest.approx(1.0)
    assert float(lr(100)) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["lamb", "lars", "adamw"])
def test_layer_stacked_parameters_are_optimised_layer_by_layer(name):
    """A model's layer-stacked parameters (``[L, ...]``, layers/stack.py) take the update each
    layer would take alone: stacked biases and norms are not decayed (rank 1 per layer) and
    LAMB/LARS trust ratios are per layer, not one ratio for the whole stack."""
    from flax import nnx

    from colossal_jax.layers.stack import LAYER_AXIS
    from colossal_jax.training.optim import matrix_mask

    k = jax.random.split(jax.random.key(1), 4)
    scale = jnp.array([1.0, 30.0])[:, None, None]  # layer 1's weights 30× larger
    w, gw = jax.random.normal(k[0], (2, 4, 3)) * scale, jax.random.normal(k[1], (2, 4, 3))
    b, gb = jax.random.normal(k[2], (2, 3)), jax.random.normal(k[3], (2, 3))
    stacked = {LAYER_AXIS: 0}

    class Layers(nnx.Module):
        def __init__(self, w, b):
            self.w = nnx.Param(w, **stacked)
            self.b = nnx.Param(b, **stacked)

    params = nnx.state(Layers(w, b))
    grads = nnx.state(Layers(gw, gb))
    mask = matrix_mask(params)
    assert bool(mask["w"]) and not bool(mask["b"])
    tx = make_optimizer(_cfg(name), 10)
    updates, _ = tx.update(grads, tx.init(params), params)
    for layer in range(2):  # each layer alone, as plain arrays: matrix w, vector b
        alone = {"w": w[layer], "b": b[layer]}
        want, _ = tx.update({"w": gw[layer], "b": gb[layer]}, tx.init(alone), alone)
        np.testing.assert_allclose(updates["w"][...][layer], want["w"], rtol=1e-5)
        np.testing.assert_allclose(updates["b"][...][layer], want["b"], rtol=1e-5)


def test_lamb_without_bias_correction_uses_the_raw_moments():
    """``bias_correction=False`` (Colossal-AI's ``Lamb`` default): ``r = m/(√v+ε) + λw``."""
    params, grads = _params()
    cfg = _cfg("lamb", bias_correction=False)
    tx = make_optimizer(cfg, total_steps=10)
    updates, _ = tx.update(grads, tx.init(params), params)
    g, w = np.asarray(grads["b"]), np.asarray(params["b"])
    m, v = (1 - cfg.b1) * g, (1 - cfg.b2) * g * g
    np.testing.assert_allclose(updates["b"], -cfg.lr * m / (np.sqrt(v) + cfg.eps), rtol=1e-6)
    g, w = np.asarray(grads["w"]), np.asarray(params["w"])
    r = (1 - cfg.b1) * g / (np.sqrt((1 - cfg.b2) * g * g) + cfg.eps) + cfg.weight_decay * w
    want = -cfg.lr * np.linalg.norm(w) / np.linalg.norm(r) * r
    np.testing.assert_allclose(updates["w"], want, rtol=1e-5)


@pytest.mark.parametrize("name", ["lamb", "lars"])
def test_trust_ratio_max_bounds_the_ratio(name):
    params, grads = _params()
    params = {"w": params["w"] * 1e3, "b": params["b"]}  # a large ratio ‖w‖/‖·‖
    free = make_optimizer(_cfg(name, lars_trust=1.0), 10)
    bounded = make_optimizer(_cfg(name, lars_trust=1.0, trust_ratio_max=2.0), 10)
    u_free, _ = free.update(grads, free.init(params), params)
    u_bound, _ = bounded.update(grads, bounded.init(params), params)
    ratio = np.linalg.norm(u_free["w"]) / np.linalg.norm(u_bound["w"])
    assert ratio > 10  # the free ratio was far above 2, the bounded one is 2
    np.testing.assert_allclose(u_bound["b"], u_free["b"])  # biases take no ratio


def test_poly_schedule_warms_up_linearly_then_decays_polynomially():
    cfg = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.0, lr_schedule="poly", poly_power=2)
    lr = schedule(cfg, 110)
    assert float(lr(5)) == pytest.approx(0.5) and float(lr(10)) == pytest.approx(1.0)
    assert float(lr(60)) == pytest.approx(0.25)  # (1 − 50/100)²
    assert float(lr(110)) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "rule,lr,warmup", [("sqrt", 4.0, 80), ("linear", 16.0, 5), ("none", 1.0, 80)]
)
def test_lr_scaling_follows_the_batch(rule, lr, warmup):
    """16× the base batch: √16 (LAMB, warm-up steps kept) or 16× (Goyal et al., warm-up
    samples kept); applied twice it changes nothing."""
    from colossal_jax.config.optimizers import for_batch

    base = OptimConfig(lr=1.0, warmup_steps=80, lr_scaling=rule, base_batch=32)
    scaled = for_batch(base, 512)
    assert (scaled.lr, scaled.warmup_steps) == (pytest.approx(lr), warmup)
    assert for_batch(scaled, 512) == scaled


def test_lr_scaling_reaches_the_run_and_needs_a_base_batch():
    from colossal_jax.checks.resolve import resolve
    from colossal_jax.config import ConfigError
    from tests.helpers import tiny_config

    cfg = tiny_config(batch_size=32)
    optim = dataclasses.replace(cfg.optim, lr_scaling="sqrt", base_batch=8)
    plan = resolve(dataclasses.replace(cfg, optim=optim), 8)
    assert plan.config.optim.lr == pytest.approx(2 * cfg.optim.lr)
    with pytest.raises(ConfigError, match="--base-batch 0 must be ≥ 1"):
        resolve(dataclasses.replace(cfg, optim=dataclasses.replace(optim, base_batch=0)), 8)
