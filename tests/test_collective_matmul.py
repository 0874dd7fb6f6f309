"""Collective matmul (``--collective-matmul on``) against the plain kernels: the same values and
gradients (1e-5, fp32) and the same bytes moved in compiled HLO, in 1D, 2D, 2.5D and 3D, for a
column linear, a row linear and fused Q/K/V (one input feeding three matmuls); inside a
pipeline stage's branch of an all-manual ``shard_map``; and a few training steps with ZeRO-3."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax import cli
from colossal_jax.analysis.hlo import analyze
from colossal_jax.config import ConfigError, ParallelConfig
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout
from colossal_jax.tensor.layout import per_stage_branches
from tests.helpers import losses, tiny_config

B, S, H, K = 8, 4, 16, 32
TOL = dict(rtol=1e-5, atol=1e-5)
REDUCTIONS = ("all-gather", "reduce-scatter", "all-reduce")

MODES = {
    "1d-t4-data2": ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    "2d-q2-data2": ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d-q2-d2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d-q2": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
}


def _rand(key: int, shape, scale=1.0):
    return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


def _linears(lay, x, x_wide, w_in, w_out, wq, wk, wv, b_in):
    """A column linear with bias, a row linear, and fused Q/K/V on one input."""
    return (
        lay.linear(x, w_in, b_in, "in"),
        lay.linear(x_wide, w_out, None, "out"),
        *lay.linears(x, [wq, wk, wv], None, "in"),
    )


@functools.cache
def _run(name: str, collective_matmul: bool):
    """Outputs, gradients of every input for fixed cotangents, and the HLO report of one
    compiled forward + backward program."""
    cfg = dataclasses.replace(MODES[name], collective_matmul=collective_matmul)
    lay = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    arrays = [
        (_rand(1, (B, S, H)), lay.residual_spec()),
        (_rand(2, (B, S, K)), lay.wide_spec()),
        (_rand(3, (H, K), 0.3), lay.weight_spec("in")),
        (_rand(4, (K, H), 0.3), lay.weight_spec("out")),
        *((_rand(5 + i, (H, H), 0.3), lay.weight_spec("in")) for i in range(3)),
        (_rand(8, (K,)), lay.bias_spec("in")),
    ]
    args = [jax.device_put(a, NamedSharding(lay.mesh, s)) for a, s in arrays]
    f = functools.partial(_linears, lay)
    cots = tuple(_rand(20 + i, o.shape) for i, o in enumerate(jax.eval_shape(f, *args)))

    def fwd_bwd(args, cots):
        out, vjp = jax.vjp(f, *args)
        return out, vjp(cots)

    compiled = jax.jit(fwd_bwd).lower(args, cots).compile()
    out, grads = compiled(args, cots)
    return out, grads, analyze(compiled.as_text())


@pytest.mark.parametrize("name", list(MODES))
def test_equals_plain_kernels_in_values_gradients_and_bytes(name):
    plain_out, plain_grads, plain = _run(name, False)
    out, grads, cm = _run(name, True)
    got_leaves, want_leaves = (
        jax.tree.leaves((out, grads)),
        jax.tree.leaves((plain_out, plain_grads)),
    )
    for got, want in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)
    assert cm.total_bytes == plain.total_bytes, (cm.by_op(), plain.by_op())
    # the bytes that left the gathers / scatters / all-reduces travel as ring permutes instead
    permuted = cm.by_op().get("collective-permute", 0.0)
    assert "collective-permute" not in plain.by_op()
    assert permuted > 0
    moved = sum(plain.by_op().get(op, 0.0) - cm.by_op().get(op, 0.0) for op in REDUCTIONS)
    assert moved == permuted


def test_ring_inside_pipeline_stage_branches():
    """1D with a ring of 4 inside an all-manual ``shard_map``, in the per-stage branches of a
    2-stage ``lax.switch`` (the pipeline executor's shape): every hop, the backward rule's too, is
    an all-to-all there (a collective-permute would wait for the other stage's devices on the
    CPU); forward and gradients equal the single-device computation."""
    cfg = ParallelConfig(pipe=2, tensor_row=4, tensor_mode="1d", collective_matmul=True)
    lay = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    x, w_in, w_out = _rand(30, (2, B, S, H)), _rand(31, (H, K), 0.3), _rand(32, (K, H), 0.3)
    cot = _rand(33, (2, B, S, H))

    def stage(i: int):
        return lambda x, wi, wo: lay.linear(
            lay.linear(x, wi, None, "in") * (i + 1), wo, None, "out"
        )

    def loss(x, w_in, w_out, cot):
        with per_stage_branches():
            y = jax.lax.switch(jax.lax.axis_index("pipe"), [stage(0), stage(1)], x[0], w_in, w_out)
        return jax.lax.psum(jnp.sum(y * cot[0]), ("pipe", "data", "seq"))

    t = lay.t
    per_device = jax.shard_map(
        jax.value_and_grad(loss, argnums=(0, 1, 2)),
        mesh=lay.mesh,
        in_specs=(P("pipe"), P(None, t), P(t, None), P("pipe")),
        out_specs=(P(), (P("pipe"), P(None, t), P(t, None))),
    )
    compiled = jax.jit(per_device).lower(x, w_in, w_out, cot).compile()
    assert "collective-permute" not in analyze(compiled.as_text()).by_op()
    got = compiled(x, w_in, w_out, cot)

    def reference(x, w_in, w_out, cot):
        return sum(jnp.sum((x[i] @ w_in * (i + 1)) @ w_out * cot[i]) for i in range(2))

    want = jax.jit(jax.value_and_grad(reference, argnums=(0, 1, 2)))(x, w_in, w_out, cot)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)


def test_training_steps_equal_with_the_flag_off():
    """Three steps of the tiny GPT, 1D tensor=4 with ZeRO-3 over data=2 (each layer's weights
    gathered inside the rematerialised stack): the loss curve with the flag on equals the one
    with it off (1e-5)."""
    par = dict(tensor_row=4, tensor_mode="1d", zero=3)
    cfgs = [
        dataclasses.replace(tiny_config(steps=3, collective_matmul=on, **par), eval_every=0)
        for on in (False, True)
    ]
    off, on = (losses(c) for c in cfgs)
    np.testing.assert_allclose(on, off, rtol=1e-5)


RING = "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"
PAIR = "(f32[4,8]{1,0}, f32[16]{0})"
PERMUTES = f"""HloModule m, num_partitions=4

ENTRY %main (a: f32[4,8], b: f32[16]) -> f32[4,8] {{
  %s = ({PAIR}, {PAIR}, u32[], u32[]) collective-permute-start(%a, %b), channel_id=1, {RING}
  %d = {PAIR} collective-permute-done(%s)
  %t = {PAIR} collective-permute(%a, %b), channel_id=2, {RING}
  ROOT %r = f32[4,8]{{1,0}} copy(%a)
}}
"""


def test_hlo_reader_counts_combined_permutes():
    """A permute of several operands (async or not) moves every operand once."""
    r = analyze(PERMUTES)
    assert r.by_op() == {"collective-permute": 2 * (4 * 8 + 16) * 4}
    assert r.count_by_op() == {"collective-permute": 2}


def test_flag_and_rule():
    """``--collective-matmul on|off`` sets the field (default off), which the layout reads; the
    rule refuses it without a tensor mode."""
    parser = cli.build_parser()
    base = ["--mesh", "tensor=8", "--tensor-mode", "1d"]
    on = cli.config_from_args(parser.parse_args([*base, "--collective-matmul", "on"]), 8)
    assert on.parallel.collective_matmul is True
    assert cli.config_from_args(parser.parse_args(base), 8).parallel.collective_matmul is False
    assert make_layout(on.parallel, build_mesh(on.parallel, jax.devices())).collective_matmul
    with pytest.raises(ConfigError, match="--collective-matmul on .* --tensor-mode is none"):
        ParallelConfig(data=8, collective_matmul=True).validate(8)
