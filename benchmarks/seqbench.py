"""The longest sequence one transformer layer (forward + backward) fits in a per-device memory
budget, per parallel mode, read from XLA's compiled memory analysis (no execution); and the
bytes each sequence-parallel attention kernel moves, read from compiled HLO.

Per-device memory of a compiled program is taken as ``argument + output + temp − alias`` bytes of
``compiled.memory_analysis()`` (parameters, the layer input and its cotangent, the gradients and
every live intermediate).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.analysis.hlo import analyze
from colossal_jax.config import ParallelConfig
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, make_local_attention
from colossal_jax.sequence import cost
from colossal_jax_benchmarks.commbench import compile_fwd_bwd
from colossal_jax_models.gpt import Block, GPTConfig


@dataclass(frozen=True)
class Candidate:
    """A named way of running the layer on ``devices`` devices (``attention``: the block
    kernel where there is no split, ``--attention``)."""

    name: str
    config: ParallelConfig
    attention: str = "auto"

    @property
    def devices(self) -> int:
        return self.config.size

    @property
    def seq_multiple(self) -> int:
        """Sequence lengths must be a multiple of this (zigzag needs 2p chunks)."""
        c = self.config
        return 2 * c.seq if c.seq_mode == "ring" else max(c.seq, 1)


def candidates(p: int) -> list[Candidate]:
    """One device, 1D tensor parallelism over ``p``, and the three sequence modes over ``p``."""
    return [
        Candidate("one device", ParallelConfig()),
        Candidate("blockwise, one device", ParallelConfig(), attention="blockwise"),
        Candidate(f"1d tensor p={p}", ParallelConfig(tensor_row=p, tensor_mode="1d")),
        Candidate(f"ring p={p}", ParallelConfig(seq=p, seq_mode="ring")),
        Candidate(f"ulysses p={p}", ParallelConfig(seq=p, seq_mode="ulysses")),
        Candidate(
            f"ring-self-attention p={p}", ParallelConfig(seq=p, seq_mode="ring-self-attention")
        ),
    ]


def layer_memory_bytes(
    cand: Candidate, seq_len: int, *, hidden: int, heads: int, batch: int = 1
) -> int:
    """Per-device bytes of one compiled layer forward + backward at ``seq_len``."""
    cfg = cand.config
    mesh = build_mesh(cfg, jax.devices()[: cfg.size])
    layout = make_layout(cfg, mesh)
    attention = make_local_attention(cfg, implementation=cand.attention)
    model_cfg = GPTConfig(n_layer=1, n_head=heads, n_embd=hidden, block_size=seq_len)
    compiled = compile_fwd_bwd(
        layout,
        functools.partial(Block, model_cfg),
        batch=batch,
        seq=seq_len,
        hidden=hidden,
        dtype=jnp.float32,
        local_attention=attention,
        with_positions=True,
    )
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def longest_sequence(
    fits: Callable[[int], bool], multiple: int, *, start: int = 256, limit: int = 1 << 22
) -> int:
    """The largest multiple of ``multiple`` for which ``fits`` holds (0 if none): doubling from
    ``start``, then binary search (memory grows monotonically with the sequence length)."""
    lo = 0
    hi = max(multiple, start - start % multiple)
    while fits(hi):
        lo = hi
        hi *= 2
        if hi > limit:
            return lo
    lo_k, hi_k = lo // multiple, hi // multiple  # fits(lo), not fits(hi)
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        if fits(mid * multiple):
            lo_k = mid
        else:
            hi_k = mid
    return lo_k * multiple


def attention_bytes(kernel_name: str, p: int, *, batch: int, seq_len: int, heads: int,
                    head_dim: int) -> dict:  # fmt: skip
    """Bytes moved per device by one sequence-parallel attention kernel (forward, and forward +
    backward), measured from compiled HLO, next to the docs/formulas.md formulas."""
    from colossal_jax.sequence.ring import ring_attention
    from colossal_jax.sequence.ring_self_attention import ring_self_attention
    from colossal_jax.sequence.ulysses import ulysses_attention

    kernel = {
        "ring": ring_attention,
        "ulysses": ulysses_attention,
        "ring-self-attention": ring_self_attention,
    }[kernel_name]
    mesh = Mesh(np.array(jax.devices()[:p]), ("seq",))
    spec = P(None, "seq")
    f = jax.shard_map(
        functools.partial(kernel, axis_name="seq", causal=True),
        mesh=mesh,
        in_specs=(spec,) * 5,
        out_specs=spec,
    )
    shape = (batch, seq_len, heads, head_dim)
    x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
    pos = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=NamedSharding(mesh, spec))

    def fwd(q, k, v, pos):
        return f(q, k, v, pos, pos)

    def both(q, k, v, pos):
        out, vjp = jax.vjp(lambda q, k, v: f(q, k, v, pos, pos), q, k, v)
        return out, vjp(out)

    measured_fwd = analyze(jax.jit(fwd).lower(x, x, x, pos).compile().as_text()).total_bytes
    measured_all = analyze(jax.jit(both).lower(x, x, x, pos).compile().as_text()).total_bytes
    h = heads * head_dim
    b, s = batch, seq_len
    if kernel_name == "ring":
        f_fwd = cost.ring_forward_elements(b, s, h, p)
        f_bwd = cost.ring_backward_elements(b, s, h, p)
    elif kernel_name == "ulysses":
        f_fwd = f_bwd = cost.ulysses_forward_elements(b, s, h, p)
    else:
        f_fwd = f_bwd = cost.ring_self_attention_forward_elements(b, s, h, p)
    return {
        "kernel": kernel_name,
        "devices": p,
        "seq_len": seq_len,
        "forward_bytes": measured_fwd,
        "forward_theory_bytes": 4 * f_fwd,
        "backward_bytes": measured_all - measured_fwd,
        "backward_theory_bytes": 4 * f_bwd,
    }
