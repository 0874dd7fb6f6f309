"""Compile one MLP block or one transformer layer (forward + backward) in a tensor-parallel mode
and read from the compiled program what each device moves and holds — no execution needed.

``measure`` returns the bytes received per device by every collective (ring model,
:mod:`colossal_jax.analysis.hlo`), the closed-form figure of :mod:`colossal_jax.tensor.cost` for
the same
block, and XLA's per-device temporary (activation) bytes from ``memory_analysis()``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.analysis.hlo import analyze
from colossal_jax.config import ParallelConfig
from colossal_jax.layers import MLP
from colossal_jax.layers.context import use_parallelism
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, tree_shardings
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.tensor.cost import Grid, layer_elements, mlp_elements
from colossal_jax.tensor.layout import LocalAttention, TensorLayout
from colossal_jax_models.gpt import Block, GPTConfig

BlockName = Literal["mlp", "layer"]


@dataclass(frozen=True)
class Shape:
    """Problem size: ``batch·seq`` tokens of width ``hidden`` (MLP width ``4·hidden``)."""

    batch: int = 16
    seq: int = 256
    hidden: int = 1024
    heads: int = 64
    dtype: str = "float32"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def parallel_config(grid: Grid, collective_matmul: bool = False) -> ParallelConfig:
    if grid.mode == "none":
        return ParallelConfig()
    return ParallelConfig(tensor_mode=grid.mode, collective_matmul=collective_matmul, **grid.mesh())


def _abstract(state, shardings, dtype):
    leaves, treedef = jax.tree.flatten(state)
    specs = jax.tree.leaves(shardings)
    if len(leaves) != len(specs):
        raise ValueError("parameter and sharding trees do not line up")
    out = [
        jax.ShapeDtypeStruct(x.shape, dtype, sharding=s) for x, s in zip(leaves, specs, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def compile_fwd_bwd(
    layout: TensorLayout,
    make: Callable[..., nnx.Module],
    *,
    batch: int,
    seq: int,
    hidden: int,
    dtype,
    local_attention: LocalAttention,
    with_positions: bool,
):
    """Compile (abstractly, nothing is allocated) one module's forward + backward under
    ``layout``: its output and the VJP of an output cotangent with respect to the parameters
    and the input, all in the layout's shardings. The output is returned too, so the forward
    collectives are not dead code."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: make(rngs=nnx.Rngs(0))))
    shardings = tree_shardings(state, layout)
    params = _abstract(state, shardings, dtype)
    mesh = layout.mesh
    x_sharding = NamedSharding(mesh, layout.residual_spec())
    x = jax.ShapeDtypeStruct((batch, seq, hidden), dtype, sharding=x_sharding)
    pos = jax.ShapeDtypeStruct(
        (batch, seq), jnp.int32, sharding=NamedSharding(mesh, layout.token_spec())
    )

    def fwd_bwd(params, x, ct, pos):
        def f(params, x):
            with use_parallelism(layout, local_attention):
                model = nnx.merge(graphdef, params)
                return model(x, pos) if with_positions else model(x)

        y, vjp = jax.vjp(f, params, x)
        return y, *vjp(ct)

    fn = jax.jit(fwd_bwd, out_shardings=(x_sharding, shardings, x_sharding))
    return fn.lower(params, x, x, pos).compile()


def compile_block(
    grid: Grid, block: BlockName, shape: Shape, devices=None, *, collective_matmul: bool = False
):
    """The compiled forward + backward of ``block`` in ``grid``'s tensor mode (its linears as
    collective matmuls with ``collective_matmul``)."""
    cfg = parallel_config(grid, collective_matmul)
    devices = list(devices if devices is not None else jax.devices())[: grid.p]
    if len(devices) < grid.p:
        raise ValueError(
            f"{grid.mode} {grid.describe()} needs {grid.p} devices, have {len(devices)}"
        )
    layout = make_layout(cfg, build_mesh(cfg, devices))
    h = shape.hidden
    layout.validate(hidden=h, mlp=4 * h, heads=shape.heads, vocab=grid.p)
    if shape.batch % layout.batch_divisor():
        raise ValueError(
            f"batch {shape.batch} is not divisible by the {layout.batch_divisor()} batch shards of "
            f"{grid.mode} {grid.describe()}"
        )
    model_cfg = GPTConfig(n_layer=1, n_head=shape.heads, n_embd=h, block_size=shape.seq)
    if block == "mlp":
        make = functools.partial(MLP, h, 4 * h)
    elif block == "layer":
        make = functools.partial(Block, model_cfg)
    else:
        raise ValueError(f"block {block!r} is not one of mlp, layer")
    return compile_fwd_bwd(
        layout,
        make,
        batch=shape.batch,
        seq=shape.seq,
        hidden=h,
        dtype=jnp.dtype(shape.dtype),
        local_attention=functools.partial(dot_product_attention, causal=True),
        with_positions=block == "layer",
    )


def theory_bytes(grid: Grid, block: BlockName, shape: Shape) -> float:
    m, h = shape.tokens, shape.hidden
    elements = (
        mlp_elements(grid, m, h, 4 * h) if block == "mlp" else layer_elements(grid, m, h, 4 * h)
    )
    return elements * jnp.dtype(shape.dtype).itemsize


def measure(
    grid: Grid, block: BlockName, shape: Shape, devices=None, *, collective_matmul: bool = False
) -> dict:
    """One benchmark record (the ``bench_comm.py`` JSON schema plus details)."""
    compiled = compile_block(grid, block, shape, devices, collective_matmul=collective_matmul)
    report = analyze(compiled.as_text())
    mem = compiled.memory_analysis()
    measured = report.total_bytes
    theory = theory_bytes(grid, block, shape)
    return {
        "mode": grid.mode,
        "devices": grid.p,
        "grid": grid.describe(),
        "block": block,
        "collective_matmul": collective_matmul,
        "measured_bytes": measured,
        "theory_bytes": theory,
        "ratio": measured / theory if theory else None,
        "temp_bytes": int(mem.temp_size_in_bytes) if mem is not None else None,
        "argument_bytes": int(mem.argument_size_in_bytes) if mem is not None else None,
        "by_op": report.by_op(),
        "shape": dataclasses.asdict(shape),
    }
