"""The planner's measurements: collectives attributed to mesh axes by their device groups, the
figures of a compiled plan, the disk cache, the CPU calibration's fit and a tiny sweep."""

from __future__ import annotations

import json
import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.analysis.axes import axis_bytes, group_axes, partition
from colossal_jax.analysis.hlo import device_groups
from colossal_jax.auto.cache import Cache, plan_key
from colossal_jax.auto.calibrate import fit_alpha_beta
from colossal_jax.auto.measure import Compiled, compile_cached
from colossal_jax.checks.resolve import resolve
from colossal_jax.config.choices import MESH_ORDER
from tests.helpers import tiny_config

SIZES = {"data": 2, "tensor_row": 2, "seq": 2}
SHAPE = tuple(SIZES.get(a, 1) for a in MESH_ORDER)
"""data=2, tensor_row=2, seq=2 in mesh order (the other axes of 1)."""
BLOCK = 64
"""f32 elements per device of the collectives below (256 bytes)."""


def _program(body, axes_of_input=tuple(MESH_ORDER)) -> str:
    mesh = jax.make_mesh(SHAPE, MESH_ORDER)
    spec = P(axes_of_input)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    x = jax.ShapeDtypeStruct((8 * BLOCK,), jnp.float32, sharding=NamedSharding(mesh, spec))
    return f.lower(x).compile().as_text()


@pytest.mark.parametrize(
    "axes,key",
    [
        (("data",), "data"),
        (("tensor_row",), "tensor_row"),
        (("seq",), "seq"),
        (("data", "seq"), "data+seq"),
        (("tensor_row", "seq"), "seq+tensor_row"),  # keys name the axes in mesh order
    ],
)
def test_a_psum_is_attributed_to_the_axes_it_reduces_over(axes, key):
    text = _program(lambda x: jax.lax.psum(x, axes))
    n = int(np.prod([SIZES[a] for a in axes]))
    assert axis_bytes(text, SHAPE, tuple(MESH_ORDER)) == {key: 2 * 4 * BLOCK * (n - 1) / n}


def test_gather_and_permute_are_attributed_and_counted_per_axis():
    def body(x):
        g = jax.lax.all_gather(x, "tensor_row", tiled=True)[:BLOCK]
        return g + jax.lax.ppermute(x, "seq", [(0, 1), (1, 0)])

    got = axis_bytes(_program(body), SHAPE, tuple(MESH_ORDER))
    assert got == {"tensor_row": 2 * 4 * BLOCK / 2, "seq": 4 * BLOCK}


def test_device_groups_read_every_form():
    assert device_groups("x replica_groups=[2,4]<=[4,2]T(1,0), y", 8) == [
        [0, 2, 4, 6],
        [1, 3, 5, 7],
    ]
    assert device_groups("x replica_groups=[4,2]<=[8], y", 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert device_groups("all-reduce(x), replica_groups={{0,4},{1,5}}, y", 8) == [[0, 4], [1, 5]]
    assert device_groups("all-reduce(x), replica_groups={}, to_apply=%a", 8) == [list(range(8))]
    pairs = "collective-permute(x), source_target_pairs={{0,1},{1,2},{4,5}}, metadata={}"
    assert device_groups(pairs, 8) == [[0, 1, 2], [4, 5]]


def test_group_axes_is_the_partition_that_matches():
    names = ("a", "b", "c")
    assert partition((2, 2, 2), (0,)) == frozenset(
        frozenset(g) for g in ([0, 4], [1, 5], [2, 6], [3, 7])
    )
    assert group_axes([[0, 1, 4, 5], [2, 3, 6, 7]], (2, 2, 2), names) == (("a", "c"), True)
    # a permute joining only some devices: contained in the partition of b, c, not equal to it
    assert group_axes([[0, 1, 2]], (2, 2, 2), names) == (("b", "c"), False)
    assert group_axes([[3]], (2, 2, 2), names) == ((), True)


@pytest.fixture(scope="module")
def tensor_plan():
    return resolve(tiny_config(data=2, tensor_row=4, tensor_mode="1d", batch_size=8), 8)


@pytest.fixture(scope="module")
def compiled_cache(tmp_path_factory):
    return Cache("compiled", tmp_path_factory.mktemp("planner-cache"))


@pytest.fixture(scope="module")
def compiled(tensor_plan, compiled_cache):
    figures, hit = compile_cached(tensor_plan, compiled_cache)
    assert not hit
    return figures


def test_a_compiled_plan_reports_flops_memory_and_bytes_per_axis(compiled):
    c = compiled
    assert c.flops > 0 and c.temp_bytes > 0 and c.compile_s > 0
    assert c.peak_bytes <= c.argument_bytes + c.output_bytes + c.temp_bytes
    assert c.peak_bytes >= c.temp_bytes
    # the 1D layout's activations travel on tensor_row, the gradients on data
    assert c.axis_bytes["tensor_row"] > 0 and c.axis_bytes["data"] > 0
    assert set(c.axis_bytes) <= {"data", "tensor_row", "data+tensor_row"}
    assert Compiled.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_the_cache_serves_a_compiled_plan_again(tensor_plan, compiled, compiled_cache):
    again, hit = compile_cached(tensor_plan, compiled_cache)
    assert hit and again == compiled


def test_the_cache_key_follows_what_determines_the_result(tensor_plan):
    other = resolve(tiny_config(data=2, tensor_row=4, tensor_mode="1d", batch_size=16), 8)
    assert plan_key(tensor_plan, "compiled")[0] == plan_key(tensor_plan, "compiled")[0]
    assert plan_key(tensor_plan, "compiled")[0] != plan_key(other, "compiled")[0]
    assert plan_key(tensor_plan, "measured", 5)[0] != plan_key(tensor_plan, "measured", 3)[0]


def test_the_cache_survives_concurrent_writers_and_a_torn_file(tmp_path):
    cache = Cache("k", tmp_path)
    values = [{"writer": i, "payload": list(range(2000))} for i in range(8)]
    threads = [threading.Thread(target=partial(cache.put, "same", v)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get("same") in values
    assert [p.name for p in cache.folder.iterdir()] == ["same.json"]  # no temporary left
    cache.path("torn").write_text('{"value": {"a": ')
    assert cache.get("torn") is None and cache.get("absent") is None


def test_alpha_beta_fit_recovers_a_line():
    points = [{"bytes": b, "seconds": 1e-4 + b / 2e9} for b in (1e3, 1e5, 1e6, 1e7)]
    fit = fit_alpha_beta(points)
    assert fit["alpha_s"] == pytest.approx(1e-4, rel=1e-3)
    assert fit["beta_bytes_per_s"] == pytest.approx(2e9, rel=1e-3)
