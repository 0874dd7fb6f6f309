"""Every tensor-parallel kernel, in every mode, against the single-device computation:
forward values and gradients to 1e-5 (fp32, matmul precision "highest")."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.config import ParallelConfig
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.tensor.replicated import ReplicatedLayout

B, S, H, K, V, HEADS = 8, 4, 16, 32, 32, 8
TOL = dict(rtol=1e-5, atol=1e-5)

MODES = {
    "1d-t8": ParallelConfig(data=1, tensor_row=8, tensor_mode="1d"),
    "1d-t4-data2": ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    "2d-q2-data2": ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d-q2-d2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d-q2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
}


@functools.cache
def layouts(name: str):
    cfg = MODES[name]
    layout = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    reference = ReplicatedLayout(build_mesh(ParallelConfig(), jax.devices()[:1]))
    return layout, reference


def _rand(key: int, shape, scale=1.0):
    return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


def _put(layout, x, spec):
    return jax.device_put(x, NamedSharding(layout.mesh, spec))


def _check(name, fn, args, specs, out_spec):
    """``fn(layout, *args)`` under the mode's layout equals it under the replicated one, and so
    does the gradient of ``sum(out * cotangent)`` with respect to every float argument."""
    layout, reference = layouts(name)

    def run(lay, put):
        placed = [_put(lay, a, s(lay)) if put else a for a, s in zip(args, specs, strict=True)]
        out = jax.jit(lambda *a: fn(lay, *a))(*placed)
        cot = jax.tree.map(lambda o: _rand(99, o.shape), out)
        floats = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]

        def scalar(*fa):
            full = list(placed)
            for i, a in zip(floats, fa, strict=True):
                full[i] = a
            o = fn(lay, *full)
            return sum(
                jnp.sum(x * c)
                for x, c in zip(jax.tree.leaves(o), jax.tree.leaves(cot), strict=True)
            )

        grads = jax.jit(jax.grad(scalar, argnums=tuple(range(len(floats)))))(
            *[placed[i] for i in floats]
        )
        return out, grads, out_spec(lay) if out_spec else None

    got, got_grads, spec = run(layout, True)
    want, want_grads, _ = run(reference, False)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)
    if spec is not None:
        out = jax.tree.leaves(got)[0]
        assert out.sharding.is_equivalent_to(NamedSharding(layout.mesh, spec), out.ndim)


@pytest.mark.parametrize("name", list(MODES))
@pytest.mark.parametrize("kind", ["in", "out"])
def test_linear(name, kind):
    n, k = (H, K) if kind == "in" else (K, H)
    src = (lambda lay: lay.residual_spec()) if kind == "in" else (lambda lay: lay.wide_spec())
    dst = (lambda lay: lay.wide_spec()) if kind == "in" else (lambda lay: lay.residual_spec())
    _check(
        name,
        lambda lay, x, w, b: lay.linear(x, w, b, kind),
        (_rand(1, (B, S, n)), _rand(2, (n, k), 0.3), _rand(3, (k,))),
        (src, lambda lay: lay.weight_spec(kind), lambda lay: lay.bias_spec(kind)),
        dst,
    )


@pytest.mark.parametrize("name", list(MODES))
def test_layer_norm(name):
    _check(
        name,
        lambda lay, x, s, b: lay.layer_norm(x, s, b, 1e-5),
        (_rand(4, (B, S, H), 2.0) + 1.0, 1.0 + _rand(5, (H,), 0.1), _rand(6, (H,), 0.1)),
        (lambda lay: lay.residual_spec(), lambda lay: lay.norm_spec(), lambda lay: lay.norm_spec()),
        lambda lay: lay.residual_spec(),
    )


@pytest.mark.parametrize("name", list(MODES))
def test_embedding(name):
    ids = jax.random.randint(jax.random.key(7), (B, S), 0, V)
    _check(
        name,
        lambda lay, ids, table: lay.embed(ids, table),
        (ids, _rand(8, (V, H))),
        (lambda lay: lay.token_spec(), lambda lay: lay.embedding_spec()),
        lambda lay: lay.residual_spec(),
    )


@pytest.mark.parametrize("name", list(MODES))
def test_lm_head_cross_entropy(name):
    """The LM head (an ``"in"`` linear to the vocabulary) and the vocab-parallel loss."""
    ids = jax.random.randint(jax.random.key(9), (B, S), 0, V)
    weights = (jax.random.uniform(jax.random.key(10), (B, S)) > 0.2).astype(jnp.float32)

    def fn(lay, x, w, targets, weights):
        return lay.cross_entropy(lay.linear(x, w, None, "in"), targets, weights)

    tokens = lambda lay: lay.token_spec()  # noqa: E731
    _check(
        name,
        fn,
        (_rand(11, (B, S, H)), _rand(12, (H, V), 0.5), ids, weights),
        (lambda lay: lay.residual_spec(), lambda lay: lay.weight_spec("in"), tokens, tokens),
        None,
    )


@pytest.mark.parametrize("name", list(MODES))
def test_attention_head_split(name):
    pos = jnp.broadcast_to(jnp.arange(S), (B, S))
    local = functools.partial(dot_product_attention, causal=True)

    def fn(lay, q, k, v, pos):
        return lay.attention(q, k, v, pos, heads=HEADS, local_attention=local)

    wide = lambda lay: lay.wide_spec()  # noqa: E731
    _check(
        name,
        fn,
        (_rand(13, (B, S, H)), _rand(14, (B, S, H)), _rand(15, (B, S, H)), pos),
        (wide, wide, wide, lambda lay: lay.token_spec()),
        wide,
    )


@pytest.mark.parametrize(
    "cfg, message",
    [
        (ParallelConfig(tensor_row=8, tensor_mode="1d"), "heads divisible by 8"),
        (
            ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
            "hidden size divisible by 4",
        ),
    ],
)
def test_validate_names_the_value(cfg, message):
    layout = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    with pytest.raises(ValueError, match=message):
        layout.validate(hidden=18, mlp=96, heads=6, vocab=32)


def test_layouts_chain_without_gathering_activations():
    """2D/2.5D/3D keep every activation partitioned: the residual and wide layouts split the
    hidden dimension, and their batch split times hidden split covers the whole tensor group."""
    for name in ("2d-q2-data2", "2.5d-q2-d2", "3d-q2"):
        layout, _ = layouts(name)
        for spec in (layout.residual_spec(), layout.wide_spec()):
            split = layout.axis_size(spec[0]) * layout.axis_size(spec[2])
            assert split == layout.mesh.size, (name, spec)
        assert P() not in (layout.residual_spec(), layout.wide_spec())


@pytest.mark.parametrize("name", list(MODES))
def test_linears_sharing_an_input(name):
    """Q, K and V in one kernel (one input gather, one input-gradient reduction)."""

    def fn(lay, x, wq, wk, wv, bq, bk, bv):
        return lay.linears(x, [wq, wk, wv], [bq, bk, bv], "in")

    w = lambda lay: lay.weight_spec("in")  # noqa: E731
    b = lambda lay: lay.bias_spec("in")  # noqa: E731
    _check(
        name,
        fn,
        (_rand(20, (B, S, H)), *(_rand(21 + i, (H, H), 0.3) for i in range(3)),
         *(_rand(24 + i, (H,)) for i in range(3))),
        (lambda lay: lay.residual_spec(), w, w, w, b, b, b),
        lambda lay: lay.wide_spec(),
    )  # fmt: skip


def test_lookup_rows_adds_its_gradient_in_float32_on_a_bf16_table():
    """The lookup's gradient on a bf16 table is one float32 scatter-add rounded once: within a
    bf16 rounding of the exact sum where the plain lookup's 16-bit adds drift far past it."""
    from colossal_jax.tensor.kernels import lookup_rows

    V, h = 64, 16
    table = jax.random.normal(jax.random.key(0), (V, h), jnp.float32)
    ids = jax.random.randint(jax.random.key(1), (4, 64), 0, 4)  # 4 rows, 64 repeats each
    g = jax.random.normal(jax.random.key(2), (4, 64, h), jnp.float32)

    def grad(lookup):
        return jax.jit(jax.grad(lambda t, i, g: jnp.sum(
            lookup(t.astype(jnp.bfloat16), i).astype(jnp.float32) * g)))  # fmt: skip

    # the lookup's output gradient arrives in bf16: the exact sum is of those rounded values
    exact = jnp.zeros((V, h)).at[ids].add(g.astype(jnp.bfloat16).astype(jnp.float32))
    new = grad(lookup_rows)(table, ids, g)
    old = grad(lambda t, i: jnp.take(t, i, axis=0))(table, ids, g)
    ulp = 2.0**-8 * jnp.abs(exact) + 1e-6  # one bf16 rounding of the sum
    assert bool(jnp.all(jnp.abs(new - exact) <= ulp))
    assert float(jnp.max(jnp.abs(old - exact) / ulp)) > 10.0  # 64 adds, each rounded (64× here)
    np.testing.assert_array_equal(  # the forward rows are the bf16 table's
        lookup_rows(table.astype(jnp.bfloat16), ids), table.astype(jnp.bfloat16)[ids]
    )
    hlo = grad(lookup_rows).lower(table, ids, g).compile().as_text()
    scatters = [line for line in hlo.splitlines() if " scatter(" in line]
    assert scatters and all("f32[" in line.split("=")[1][:12] for line in scatters)
