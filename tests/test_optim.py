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
