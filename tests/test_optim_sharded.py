"""One LAMB and one LARS step of a whole model (gpt2-tiny: matrices, biases, layer-norm scales,
layer-stacked blocks) equal a hand-written NumPy step of the papers' rules to 1e-6, unsharded
and under 2D and 3D tensor parallelism, ZeRO-3 and a 1F1B pipeline: the trust ratios are of
whole layers however the layers are split (issue: large-batch LAMB and LARS).

The update is applied as the train step applies it (``run.tx.update`` under ``jit`` on the
run's global arrays, gradients in the run's gradient shardings); the last test runs the train
step itself and checks its update against the same NumPy rule for the gradient it used.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from colossal_jax.config import OptimConfig
from colossal_jax.training.batches import global_batch
from colossal_jax.training.optim import _layer_stacked, matrix_mask
from colossal_jax.training.run import build, init_state
from colossal_jax.training.steps import make_train_step
from tests.helpers import tiny_config

OPTIMIZERS = {
    # warm-up 0: the first step runs at the peak rate; clipping on, so the global norm is tested
    "lamb": OptimConfig(name="lamb", lr=0.05, warmup_steps=0, weight_decay=0.1, clip_norm=1.0),
    "lars": OptimConfig(
        name="lars", lr=1.0, warmup_steps=0, weight_decay=0.1, clip_norm=1.0, lars_trust=0.02
    ),
}
MESHES = {
    "unsharded": dict(data=1, devices=1),
    "2d": dict(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),  # --mesh data=2,tensor=4
    "3d": dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
    "zero3": dict(data=8, zero=3),
    "1f1b": dict(data=4, pipe=2, pipeline="1f1b", microbatches=2, zero=1),
}


def _run(optim: str, mesh: str, **extra):
    kw = dict(MESHES[mesh])
    cfg = tiny_config(steps=4, batch_size=8, devices=kw.pop("devices", 8), **kw)
    return build(dataclasses.replace(cfg, optim=OPTIMIZERS[optim], eval_every=0, **extra))


def _layer_norm(x: np.ndarray, stacked: bool) -> np.ndarray:
    axes = tuple(range(1, x.ndim)) if stacked else None
    return np.sqrt(np.sum(x * x, axis=axes, keepdims=True))


def numpy_step(cfg: OptimConfig, w: list, g: list, matrix: list, stacked: list) -> list:
    """The new parameters after the first step from zero state, in float64, as the papers
    write it: global-norm clipping, then LAMB (bias-corrected moments, ``r = m̂/(√v̂+ε) + λw``,
    ratio ``‖w‖/‖r‖``) or LARS (``v = γ·η·‖w‖/(‖g‖+λ‖w‖)·(g+λw)``); biases and norms (not
    ``matrix``) take neither decay nor ratio; norms per layer where ``stacked``."""
    w = [np.asarray(x, np.float64) for x in w]
    g = [np.asarray(x, np.float64) for x in g]
    total = np.sqrt(sum(np.sum(x * x) for x in g))
    if cfg.clip_norm and total > cfg.clip_norm:
        g = [x * cfg.clip_norm / total for x in g]
    out = []
    for wi, gi, is_matrix, is_stacked in zip(w, g, matrix, stacked, strict=True):
        if cfg.name == "lamb":
            m, v, t = (1 - cfg.b1) * gi, (1 - cfg.b2) * gi * gi, 1
            r = (m / (1 - cfg.b1**t)) / (np.sqrt(v / (1 - cfg.b2**t)) + cfg.eps)
            if is_matrix:
                r = r + cfg.weight_decay * wi
                wn, rn = _layer_norm(wi, is_stacked), _layer_norm(r, is_stacked)
                r = np.where((wn > 0) & (rn > 0), wn / np.where(rn > 0, rn, 1), 1.0) * r
            out.append(wi - cfg.lr * r)
        else:
            u = gi
            if is_matrix:
                wn, gn = _layer_norm(wi, is_stacked), _layer_norm(gi, is_stacked)
                local = cfg.lars_trust * wn / (gn + cfg.weight_decay * wn)
                u = local * (gi + cfg.weight_decay * wi)
            out.append(wi - cfg.lr * u)  # momentum from 0: v = γ·u
    return out


def _masks(run) -> tuple[list, list]:
    """Per leaf of the parameters: takes decay and a trust ratio; is stacked over layers."""
    is_var = lambda x: isinstance(x, nnx.Variable)
    stacked = jax.tree.map(_layer_stacked, run.abstract_params, is_leaf=is_var)
    return [bool(x) for x in jax.tree.leaves(matrix_mask(run.abstract_params))], [
        bool(x) for x in jax.tree.leaves(stacked)
    ]


def _synthetic_grads(params, shardings):
    """Gradients of every parameter's shape, each leaf at its own scale, in ``shardings``."""
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(0)
    grads = [
        (rng.standard_normal(x.shape) * 10.0 ** rng.uniform(-3, 0)).astype(np.float32)
        for x in leaves
    ]
    return jax.device_put(jax.tree.unflatten(tree, grads), shardings)


def _assert_step(run, before: list, grads: list, after: list) -> None:
    matrix, stacked = _masks(run)
    assert any(matrix) and not all(matrix) and any(stacked), "matrices, vectors and stacks"
    want = numpy_step(run.cfg.optim, before, grads, matrix, stacked)
    for got, w, b in zip(after, want, before, strict=True):
        delta_got = np.asarray(got, np.float64) - np.asarray(b, np.float64)
        np.testing.assert_allclose(delta_got, w - np.asarray(b, np.float64), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def unsharded_after():
    return {}


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("optim", list(OPTIMIZERS))
def test_one_update_equals_the_numpy_step(optim, mesh, unsharded_after):
    run = _run(optim, mesh)
    params, opt_state = init_state(run)
    grads = _synthetic_grads(params, run.grad_shardings)
    before = [np.asarray(x) for x in jax.tree.leaves(params)]
    g = [np.asarray(x) for x in jax.tree.leaves(grads)]

    @jax.jit
    def update(params, opt_state, grads):  # as training/steps.py applies it
        updates, opt_state = run.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates)

    after = [np.asarray(x) for x in jax.tree.leaves(update(params, opt_state, grads))]
    _assert_step(run, before, g, after)
    if mesh == "unsharded":
        unsharded_after[optim] = after
    elif optim in unsharded_after:  # the same initial parameters and gradients on every mesh
        for got, want in zip(after, unsharded_after[optim], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mesh", ["2d", "1f1b"])
def test_the_train_step_applies_the_numpy_lamb_step(mesh):
    """The compiled train step's update is the NumPy LAMB step of the gradient it computed (read
    back from the first moment: ``m = (1−b1)·g`` after one step from zero, ``g`` clipped)."""
    run = _run("lamb", mesh)
    params, opt_state = init_state(run)
    before = [np.asarray(x) for x in jax.tree.leaves(params)]
    new_params, new_opt, _ = make_train_step(run)(params, opt_state, global_batch(run, 0))
    adam = next(s for s in new_opt if isinstance(s, optax.ScaleByAdamState))
    b1 = run.cfg.optim.b1
    g = [np.asarray(m, np.float64) / (1 - b1) for m in jax.tree.leaves(adam.mu)]
    no_clip = dataclasses.replace(run.cfg.optim, clip_norm=0.0)  # mu holds the clipped gradient
    matrix, stacked = _masks(run)
    want = numpy_step(no_clip, before, g, matrix, stacked)
    for got, w, b in zip(jax.tree.leaves(new_params), want, before, strict=True):
        delta = np.asarray(got, np.float64) - np.asarray(b, np.float64)
        np.testing.assert_allclose(delta, w - b, rtol=0, atol=1e-6)
