"""Bytes moved, read from compiled HLO, against the docs/formulas.md formulas: the HLO reader on
hand-written modules, every tensor mode's MLP block, and ring attention at p = 8."""

from __future__ import annotations

import numpy as np
import pytest

from colossal_jax.analysis.hlo import analyze
from colossal_jax.sequence.cost import (
    ring_backward_elements,
    ring_forward_elements,
    ulysses_forward_elements,
)
from colossal_jax.tensor.cost import Grid, grids, mlp_elements
from colossal_jax_benchmarks.commbench import Shape, measure
from colossal_jax_benchmarks.seqbench import attention_bytes

HLO = """HloModule m, num_partitions=8

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %cp = f32[4,8]{1,0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %cp)
}

%cond (p: (s32[], f32[4,8])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4,8], b: bf16[16]) -> f32[4,8] {
  %ag = f32[16,8]{1,0} all-gather(%a), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %ags = (f32[4,8]{1,0}, f32[8,8]{1,0}) all-gather-start(%a), replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %agd = f32[8,8]{1,0} all-gather-done(%ags)
  %rs = f32[1,8]{1,0} reduce-scatter(%a), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, to_apply=%add
  %ar = bf16[16]{0} all-reduce(%b), replica_groups={}, to_apply=%add
  %w = (s32[], /*index=1*/f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %r = f32[4,8]{1,0} copy(%a)
}
"""


def test_hlo_reader_ring_model():
    r = analyze(HLO)
    ops = r.by_op()
    assert ops["all-gather"] == 16 * 8 * 4 * 3 / 4 + 8 * 8 * 4 / 2  # iota [2,4] + async start once
    assert ops["reduce-scatter"] == 1 * 8 * 4 * 3  # result r·(n−1)
    assert ops["all-reduce"] == 2 * 16 * 2 * 7 / 8  # replica_groups={} is all 8 partitions
    assert ops["collective-permute"] == 3 * 4 * 8 * 4  # inside a 3-trip loop
    assert r.count_by_op()["collective-permute"] == 3
    assert r.unknown_trip_counts == 0


SMALL = Shape(batch=16, seq=16, hidden=64, heads=8)


@pytest.mark.parametrize("grid", [g for n in (4, 8) for g in grids(n)], ids=str)
def test_mlp_block_bytes_match_formula(grid):
    rec = measure(grid, "mlp", SMALL)
    theory = mlp_elements(grid, SMALL.tokens, SMALL.hidden, 4 * SMALL.hidden) * 4
    assert rec["theory_bytes"] == theory
    assert abs(rec["measured_bytes"] / theory - 1) < 0.10, rec


@pytest.mark.parametrize("grid", [g for n in (4, 8) for g in grids(n)], ids=str)
def test_layer_bytes_match_formula(grid):
    """A whole layer: fused Q/K/V (one input gather and one gradient reduction), output
    projection, MLP and two split layer norms."""
    rec = measure(grid, "layer", SMALL)
    assert abs(rec["measured_bytes"] / rec["theory_bytes"] - 1) < 0.10, rec


def test_order_of_modes_at_scale_is_a_formula_fact():
    """At 64 devices 3D < 2.5D < 2D < 1D for the MLP block (docs/formulas.md §2.3 worked table)."""
    m, h = 4096, 1024
    by = {g.mode: mlp_elements(g, m, h, 4 * h) / 1e6 for g in grids(64)}
    assert by["3d"] < by["2.5d"] < by["2d"] < by["1d"]
    np.testing.assert_allclose(
        [by["1d"], by["2d"], by["2.5d"], by["3d"]], [16.51, 6.42, 5.90, 4.72], atol=0.01
    )
    assert Grid("2.5d", 64, q=4, d=4) in grids(64)


def test_ring_attention_bytes_match_formula_at_p8():
    """2(p−1)/p·b·s·h forward, 4(p−1)/p·b·s·h backward (docs/formulas.md), within 10%."""
    r = attention_bytes("ring", 8, batch=2, seq_len=256, heads=4, head_dim=32)
    assert abs(r["forward_bytes"] / r["forward_theory_bytes"] - 1) < 0.10, r
    assert abs(r["backward_bytes"] / r["backward_theory_bytes"] - 1) < 0.10, r
    assert r["forward_theory_bytes"] == 4 * ring_forward_elements(2, 256, 128, 8)
    assert r["backward_theory_bytes"] == 4 * ring_backward_elements(2, 256, 128, 8)


def test_ulysses_bytes_match_formula_at_p8():
    r = attention_bytes("ulysses", 8, batch=2, seq_len=256, heads=8, head_dim=16)
    assert abs(r["forward_bytes"] / r["forward_theory_bytes"] - 1) < 0.10, r
    assert r["forward_theory_bytes"] == 4 * ulysses_forward_elements(2, 256, 128, 8)
