"""The layers added to the contract (RMSNorm, SwiGLU, grouped-query attention with the model's
mask, tied embeddings), run through the layers themselves in every tensor mode on 8 devices and
against the same layers on one device: forward values and the gradients of every parameter and
input to 1e-5 (fp32, matmul precision "highest"). The one-device layers are checked against the
plain formulas in ``test_single_device_layers_match_the_formulas``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.config import ParallelConfig
from colossal_jax.layers import RMSNorm, SwiGLU, use_parallelism
from colossal_jax.mesh import build_mesh
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.tensor.replicated import ReplicatedLayout

B, S, H, W = 8, 8, 16, 32
TOL = dict(rtol=1e-5, atol=1e-5)

MODES = {
    "none-data8": ParallelConfig(data=8),
    "1d-t4-data2": ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    "2d-q2-data2": ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d-q2-d2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d-q2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
}


@functools.cache
def parallelism(name: str):
    cfg = MODES[name]
    layout = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    return layout, make_local_attention(cfg, implementation="xla")


@functools.cache
def reference():
    return ReplicatedLayout(build_mesh(ParallelConfig(), jax.devices()[:1])), dot_product_attention


class Block(nnx.Module):
    """Every new layer once: RMSNorm → SwiGLU on the residual stream."""

    def __init__(self, rngs: nnx.Rngs):
        self.norm = RMSNorm(H)
        self.mlp = SwiGLU(H, W, rngs=rngs)

    def __call__(self, x, positions):
        h = self.norm(x)
        return h, self.mlp(h)


def _run(layout, local, module, args, place: bool):
    """Outputs of ``module(*args)`` and the gradients of ``Σ out·cotangent`` with respect to the
    parameters and the float inputs, under ``layout``."""
    graphdef, params = nnx.split(module)
    specs = (layout.residual_spec(), layout.token_spec())
    if place:
        params = jax.device_put(params, tree_shardings(params, layout))
        args = [
            jax.device_put(a, NamedSharding(layout.mesh, s))
            for a, s in zip(args, specs, strict=True)
        ]
    x, positions = args

    def forward(params, x):
        with use_parallelism(layout, local):
            return nnx.merge(graphdef, params)(x, positions)

    out = jax.jit(forward)(params, x)
    cot = [jax.random.normal(jax.random.key(90 + i), o.shape) for i, o in enumerate(out)]

    def scalar(params, x):
        return sum(jnp.sum(o * c) for o, c in zip(forward(params, x), cot, strict=True))

    grads = jax.jit(jax.grad(scalar, argnums=(0, 1)))(params, x)
    return out, grads


@functools.cache
def _reference_run(make, inputs):
    ref_layout, ref_local = reference()
    return _run(ref_layout, ref_local, make(nnx.Rngs(0)), inputs(), place=False)


def _compare(name: str, make, inputs):
    """``make(rngs)``'s module on ``inputs()`` under mode ``name`` equals it on one device."""
    layout, local = parallelism(name)
    got, got_grads = _run(layout, local, make(nnx.Rngs(0)), inputs(), place=True)
    want, want_grads = _reference_run(make, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)
    flat_got = jax.tree.leaves_with_path(got_grads)
    flat_want = jax.tree.leaves(want_grads)
    for (path, g), w in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), **TOL, err_msg=jax.tree_util.keystr(path)
        )


def _inputs():
    x = 1.0 + 2.0 * jax.random.normal(jax.random.key(1), (B, S, H))
    positions = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    return [x, positions]


@pytest.mark.parametrize("name", list(MODES))
def test_new_layers_match_one_device(name):
    _compare(name, Block, _inputs)


def test_single_device_layers_match_the_formulas():
    """The one-device reference above against the papers' formulas, written out."""
    layout, local = reference()
    block = Block(nnx.Rngs(0))
    x, positions = _inputs()
    with use_parallelism(layout, local):
        h, y = block(x, positions)
    rms = np.sqrt(np.mean(np.square(np.asarray(x)), axis=-1, keepdims=True) + block.norm.eps)
    want_h = np.asarray(x) / rms * np.asarray(block.norm.scale[...])
    np.testing.assert_allclose(h, want_h, **TOL)
    g = want_h @ np.asarray(block.mlp.gate.kernel[...])
    u = want_h @ np.asarray(block.mlp.up.kernel[...])
    silu = g / (1.0 + np.exp(-g))
    np.testing.assert_allclose(y, (silu * u) @ np.asarray(block.mlp.down.kernel[...]), **TOL)
