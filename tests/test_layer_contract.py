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
from colossal_jax.layers import Embed, HiddenDense, RMSNorm, SelfAttention, SwiGLU, use_parallelism
from colossal_jax.layers.rope import apply_rope
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.sequence.zigzag import zigzag_permutation
from colossal_jax.tensor.replicated import ReplicatedLayout
from tests.test_masks import plain_attention

B, S, H, W, HEADS, KV, V = 8, 8, 32, 64, 8, 4, 32
TOL = dict(rtol=1e-5, atol=1e-5)

MODES = {
    "none-data8": ParallelConfig(data=8),
    "1d-t4-data2": ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    "2d-q2-data2": ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d-q2-d2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d-q2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
    # sequence modes under a tensor split: heads split 2 ways, then over seq (ring, Ulysses)
    "1d-t2-ring4": ParallelConfig(tensor_row=2, tensor_mode="1d", seq=4, seq_mode="ring"),
    "1d-t2-ulysses4": ParallelConfig(tensor_row=2, tensor_mode="1d", seq=4, seq_mode="ulysses"),
}


@functools.cache
def parallelism(name: str):
    cfg = MODES[name]
    layout = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    return layout, make_local_attention(cfg, implementation="xla")


@functools.cache
def reference():
    return ReplicatedLayout(build_mesh(ParallelConfig(), jax.devices()[:1])), dot_product_attention


def token_ids(positions):
    return jnp.maximum(positions, 0) * 5 % V


class Block(nnx.Module):
    """Every new layer once: RMSNorm, grouped-query attention (RoPE, biases of both widths, the
    model's mask), SwiGLU, an embedding table used twice, as the lookup and as the tied LM
    head, and a hidden-to-hidden linear of the residual stream. Returns each layer's output."""

    causal = True

    def __init__(self, rngs: nnx.Rngs):
        self.embed = Embed(V, H, rngs=rngs, init_std=0.5)
        self.norm = RMSNorm(H)
        self.attn = SelfAttention(
            H, HEADS, kv_heads=KV, rngs=rngs, rope_theta=10000.0, causal=self.causal
        )
        self.mlp = SwiGLU(H, W, rngs=rngs)
        self.transform = HiddenDense(H, rngs=rngs, init_std=0.3)

    def __call__(self, x, positions):
        h = self.norm(x + self.embed(token_ids(positions)))
        a = self.attn(h, positions)
        y = self.mlp(h)
        return h, a, y, self.embed.attend(a + y), self.transform(a + y)


class BidirectionalBlock(Block):
    causal = False


def _run(layout, local, module, args, place: bool, order=None):
    """Outputs of ``module(*args)`` and the gradients of ``Σ out·cotangent`` with respect to the
    parameters and the input ``x``, under ``layout``. With ``order``, ``args`` are in that token
    order and the outputs and ``dx`` are returned in the original order."""
    graphdef, params = nnx.split(module)
    specs = (layout.residual_spec(), layout.token_spec())
    if place:
        params = jax.device_put(params, tree_shardings(params, layout))
        args = [
            jax.device_put(a, NamedSharding(layout.mesh, s))
            for a, s in zip(args, specs, strict=True)
        ]
    x, positions = args

    inv = None if order is None else np.argsort(order)

    def forward(params, x):
        with use_parallelism(layout, local):
            out = nnx.merge(graphdef, params)(x, positions)
        return out if inv is None else [o[:, inv] for o in out]

    shapes = jax.eval_shape(forward, params, x)
    leaves, tree = jax.tree.flatten(shapes)
    cot = tree.unflatten(
        [jax.random.normal(jax.random.key(90 + i), o.shape) for i, o in enumerate(leaves)]
    )

    @jax.jit  # one compile: outputs and their pullback
    def outputs_and_grads(params, x):
        out, pullback = jax.vjp(forward, params, x)
        return out, pullback(cot)

    out, (d_params, dx) = outputs_and_grads(params, x)
    return out, (d_params, dx if inv is None else dx[:, inv])


@functools.cache
def _reference_run(make):
    ref_layout, ref_local = reference()
    return _run(ref_layout, ref_local, make(nnx.Rngs(0)), _inputs(), place=False)


def _compare(name: str, make, order=None):
    """``make(rngs)``'s module under mode ``name`` equals it on one device; with ``order`` the
    tokens (and their positions) are laid out in that order, as the loader does for zigzag."""
    layout, local = parallelism(name)
    x, positions = _inputs()
    if order is not None:
        x, positions = x[:, order], positions[:, order]
    module = make(nnx.Rngs(0))
    got, (g_params, g_x) = _run(layout, local, module, [x, positions], True, order)
    want, (w_params, w_x) = _reference_run(make)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL, err_msg=f"output {i}")
    np.testing.assert_allclose(np.asarray(g_x), np.asarray(w_x), **TOL, err_msg="d input")
    flat_got = jax.tree.leaves_with_path(g_params)
    for (path, g), w in zip(flat_got, jax.tree.leaves(w_params), strict=True):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), **TOL, err_msg=jax.tree_util.keystr(path)
        )


def _inputs():
    """The residual stream and positions; rows 1 and 2 padded (trailing, leading: -1)."""
    x = 1.0 + 2.0 * jax.random.normal(jax.random.key(1), (B, S, H))
    pos = np.tile(np.arange(S), (B, 1))
    pos[1, S - 3 :] = -1
    pos[2] = np.r_[-1, -1, np.arange(S - 2)]
    return [x, jnp.asarray(pos, jnp.int32)]


@pytest.mark.parametrize("name", [n for n in MODES if "ring" not in n and "ulysses" not in n])
def test_new_layers_match_one_device(name):
    """Bidirectional attention with padding, GQA (kv heads split with the query heads), RoPE."""
    _compare(name, BidirectionalBlock)


def test_new_layers_under_zigzag_ring_attention():
    """Causal GQA with padding, the sequence in zigzag order over ring attention."""
    _compare("1d-t2-ring4", Block, order=zigzag_permutation(S, 4))


def test_new_layers_under_ulysses():
    """Ulysses with 2 K/V heads per tensor shard over seq=4: the kernel repeats them to 4."""
    _compare("1d-t2-ulysses4", BidirectionalBlock)


def test_single_device_layers_match_the_formulas():
    """The one-device reference above against the papers' formulas, written out (GQA as
    multi-head attention on key/value heads repeated ``HEADS/KV`` times)."""
    block = Block(nnx.Rngs(0))
    x, positions = _inputs()
    h, a, y, logits, t = _reference_run(Block)[0]  # the outputs the other tests compare with
    table = np.asarray(block.embed.table[...])
    x = np.asarray(x) + table[np.asarray(token_ids(positions))]
    rms = np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + block.norm.eps)
    want_h = x / rms * np.asarray(block.norm.scale[...])
    np.testing.assert_allclose(h, want_h, **TOL)
    g = want_h @ np.asarray(block.mlp.gate.kernel[...])
    u = want_h @ np.asarray(block.mlp.up.kernel[...])
    silu = g / (1.0 + np.exp(-g))
    np.testing.assert_allclose(y, (silu * u) @ np.asarray(block.mlp.down.kernel[...]), **TOL)

    def proj(dense, heads):
        out = want_h @ np.asarray(dense.kernel[...]) + np.asarray(dense.bias[...])
        return out.reshape(B, S, heads, H // HEADS)

    at = block.attn

    @jax.jit
    def heads_attention(q, k, v):
        clamped = jnp.maximum(positions, 0)
        q = apply_rope(q, clamped)
        k = jnp.repeat(apply_rope(k, clamped), HEADS // KV, axis=2)
        v = jnp.repeat(v, HEADS // KV, axis=2)
        return plain_attention(q, k, v, positions, causal=True).reshape(B, S, H)

    o = heads_attention(proj(at.query, HEADS), proj(at.key, KV), proj(at.value, KV))
    want_a = o @ np.asarray(at.out.kernel[...]) + np.asarray(at.out.bias[...])
    np.testing.assert_allclose(a, want_a, **TOL)
    np.testing.assert_allclose(logits, (want_a + np.asarray(y)) @ table.T, **TOL)
    tr = block.transform
    want_t = (want_a + np.asarray(y)) @ np.asarray(tr.kernel[...]) + np.asarray(tr.bias[...])
    np.testing.assert_allclose(t, want_t, **TOL)


class PerStageTransform(nnx.Module):
    """A hidden-to-hidden linear traced as inside a pipeline's per-stage branches."""

    def __init__(self, rngs: nnx.Rngs):
        self.norm = RMSNorm(H)
        self.transform = HiddenDense(H, rngs=rngs, init_std=0.3)

    def __call__(self, x, positions):
        from colossal_jax.tensor.layout import per_stage_branches

        with per_stage_branches():
            return (self.transform(self.norm(x)),)


@pytest.mark.parametrize("name", ["1d-t4-data2", "3d-q2"])
def test_hidden_dense_inside_pipeline_branches(name):
    """3D re-cuts the residual for a hidden-to-hidden linear by a grid transpose, or, inside a
    pipeline's per-stage branches (no ``ppermute``), by gathers and slices: same values and
    gradients as one device."""
    _compare(name, PerStageTransform)


def test_tied_head_inside_pipeline_branches():
    """Inside a pipeline's per-stage branches the 2D (and 2.5D: the same code per depth slice)
    tied head avoids the grid transpose's ppermute (gather the table, reduce-scatter the
    logits); same values and gradients."""
    from colossal_jax.tensor.layout import per_stage_branches
    from tests.test_tensor_kernels import B as KB
    from tests.test_tensor_kernels import H as KH
    from tests.test_tensor_kernels import S as KS
    from tests.test_tensor_kernels import _check, _rand

    def fn(lay, x, table):
        with per_stage_branches():
            return lay.tied_logits(x, table)

    _check(
        "2d-q2-data2",
        fn,
        (_rand(30, (KB, KS, KH)), _rand(31, (V, KH))),
        (lambda lay: lay.residual_spec(), lambda lay: lay.embedding_spec()),
        lambda lay: lay.wide_spec(),
    )
