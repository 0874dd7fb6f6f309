"""The stack's chunks moved to the stages that run them, point to point: the exchange equals
indexing the whole stack with the chunk-order permutation, its inverse brings it back, and a
chunk is sent only when another stage runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from colossal_jax.pipeline.chunk_order import (
    moves,
    permutation,
    rounds,
    sent_chunks,
    to_chunk_order,
    to_model_order,
)
from colossal_jax.pipeline.schedule import build

CASES = [("interleaved", 2, 2), ("interleaved", 4, 2), ("interleaved", 2, 4), ("zb-v", 4, 2)]


@pytest.mark.parametrize("name,p,v", CASES)
def test_rounds_are_perfect_matchings_covering_every_move(name, p, v):
    schedule = build(name, p, 8, v)
    rs = rounds(schedule)
    assert len(rs) == v
    seen = set()
    for r in rs:
        assert sorted(r.dst) == list(range(p))  # every stage receives exactly one chunk
        for d in range(p):
            seen.add((d, r.src_local[d], r.dst[d], r.dst_local[r.dst[d]]))
    assert seen == set(moves(schedule))
    stays = [sum(s == to for s, _, to, _ in moves(schedule) if s == d) for d in range(p)]
    assert sent_chunks(schedule) == v - min(stays)


@pytest.mark.parametrize("name,p,v", CASES)
def test_the_exchange_equals_the_permutation_and_its_inverse_undoes_it(name, p, v):
    schedule = build(name, p, 8, v)
    n_layer = 2 * p * v
    mesh = Mesh(np.array(jax.devices()[:p]), ("pipe",))
    stack = {
        "w": jnp.arange(n_layer * 3 * 2, dtype=jnp.float32).reshape(n_layer, 3, 2),
        "b": jnp.arange(n_layer, dtype=jnp.float32) * 10,
    }
    spec = {"w": P("pipe"), "b": P("pipe")}
    there = jax.jit(
        jax.shard_map(
            lambda t: to_chunk_order(t, schedule), mesh=mesh, in_specs=(spec,), out_specs=spec
        )
    )(stack)
    perm = permutation(n_layer, schedule)
    for k in stack:
        np.testing.assert_array_equal(there[k], stack[k][perm])
    back = jax.jit(
        jax.shard_map(
            lambda t: to_model_order(t, schedule), mesh=mesh, in_specs=(spec,), out_specs=spec
        )
    )(there)
    for k in stack:
        np.testing.assert_array_equal(back[k], stack[k])
