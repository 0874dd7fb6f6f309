"""The planner's measurements: collectives attributed to mesh axes by their device groups, the
figures of a compiled plan, the disk cache, the CPU calibration's fit and a tiny sweep."""

from __future__ import annotations

import dataclasses
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
from colossal_jax.auto import measure, sweep, sweep_report, sweep_summary
from colossal_jax.auto.cache import Cache, plan_key
from colossal_jax.auto.calibrate import fit_alpha_beta
from colossal_jax.auto.choose import budget_of
from colossal_jax.auto.hardware import hardware
from colossal_jax.auto.measure import Compiled
from colossal_jax.auto.sweep_summary import spearman
from colossal_jax.checks.resolve import resolve
from colossal_jax.config.choices import MESH_ORDER
from colossal_jax.config.errors import ConfigError
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
def swept(tmp_path_factory):
    """A tiny sweep on 4 devices: the planner's rows, two of them measured (one step each) —
    ``data=2,tensor_row=2`` (1D) and ``data=4`` — the first standing in for the planner's
    choice (which is measured in the full sweep, not here: its compile is slower)."""
    cfg = dataclasses.replace(tiny_config(batch_size=8, seq_len=32, devices=4), eval_every=0)
    hw = hardware("cpu")
    rows = sweep.plans(cfg, 4, hw, budget_of(hw, 4), pattern="^(data=2,tensor_row=2 tp=1d|data=4) ")
    assert rows[0].chosen and sum(r.chosen for r in rows) == 1
    # in a fixed order whatever the planner's ranking: the 1D layout first
    wanted = ("data=2,tensor_row=2", "data=4")
    picked = [r for r in rows if r.name.split()[0] in wanted and " zero=0 " in f"{r.name} "]
    measured = sorted(picked, key=lambda r: r.name.split()[0] != "data=2,tensor_row=2")[:2]
    assert [r.name.split()[0] for r in measured] == list(wanted)
    for r in rows:
        r.chosen = False
    measured[0].chosen = True
    cache = Cache("measured", tmp_path_factory.mktemp("planner-cache"))
    seen: list = []
    sweep.run_sweep(measured, steps=1, cache=cache, progress=seen.append, paired=True)
    assert seen == measured
    return cfg, hw, measured, cache


def test_a_compiled_plan_reports_flops_memory_and_bytes_per_axis(swept):
    c = swept[2][0].compiled
    assert c.flops > 0 and c.temp_bytes > 0 and c.compile_s > 0
    assert c.peak_bytes <= c.argument_bytes + c.output_bytes + c.temp_bytes
    assert c.peak_bytes >= c.temp_bytes
    # the 1D layout's activations travel on tensor_row, the gradients on data
    assert c.axis_bytes["tensor_row"] > 0 and c.axis_bytes["data"] > 0
    assert set(c.axis_bytes) <= {"data", "tensor_row", "data+tensor_row"}
    assert set(swept[2][1].compiled.axis_bytes) == {"data"}
    assert Compiled.from_json(json.loads(json.dumps(c.to_json()))) == c


def test_a_tiny_sweep_reports_correlation_memory_error_and_regret(swept, tmp_path):
    rows = swept[2]
    assert all(r.error is None and r.step_s > 0 and r.reference_s > 0 for r in rows)
    scale = sorted(r.reference_s for r in rows)
    for r in rows:  # normalised: relative time × the reference's median (of two: their mean)
        assert r.normalized_s == pytest.approx(r.step_s / r.reference_s * sum(scale) / 2)
    summary = sweep_summary.summarize(rows)
    assert summary["paired"]
    assert summary["measured"] == 2 and summary["failed"] == []
    assert summary["best_step_s"] == min(r.normalized_s for r in rows)
    assert summary["regret"] == pytest.approx(summary["chosen_step_s"] / summary["best_step_s"] - 1)
    assert summary["spearman"] in (-1.0, 1.0)
    assert summary["max_memory_error"] == max(r.memory_error for r in rows)
    json.dumps([r.to_json() for r in rows])
    assert sweep_report.table(rows).count("\n") == len(rows) + 1
    sweep_report.plot(rows, str(tmp_path / "sweep.png"), "tiny")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


def test_the_sweep_serves_a_measured_plan_from_the_cache(swept):
    cfg, hw, rows, cache = swept
    again = [r for r in sweep.plans(cfg, 4, hw, budget_of(hw, 4)) if r.name == rows[1].name]
    # paired results are keyed by their reference (the first row): the same as above; all
    # cached, so the reference is not even compiled
    sweep.run_sweep([rows[0], *again], steps=1, cache=cache, paired=True)
    assert again[0].cached and again[0].step_s == rows[1].step_s
    assert again[0].compiled == rows[1].compiled


def test_rounds_keep_each_plans_median_round_and_report_the_first_round_beside(swept):
    rows = [dataclasses.replace(r, rounds=[]) for r in swept[2]]
    # relative times (step over the reference around it): 1.2, 1.5, 1.3 for the chosen 1D
    # plan, 1.0, 0.7, 1.1 for data=4 (its 0.7: a round whose reference was slowed)
    rows[0].rounds = [(1.2, 1.0), (1.8, 1.2), (1.3, 1.0)]
    rows[1].rounds = [(1.5, 1.5), (1.4, 2.0), (1.1, 1.0)]
    for r in rows:
        sweep.combine_rounds(r)
    assert (rows[0].step_s, rows[0].reference_s) == (1.3, 1.0)  # the median, 1.3
    assert (rows[1].step_s, rows[1].reference_s) == (1.5, 1.5)  # the median, 1.0
    sweep.normalize(rows)
    summary = sweep_summary.summarize(rows)
    assert summary["rounds"] == 3
    assert summary["regret"] == pytest.approx(0.3)  # the chosen 1D plan against data=4
    assert summary["first_round"]["regret"] == pytest.approx(0.2)
    unpaired = dataclasses.replace(rows[0], rounds=[(1.2, None), (1.1, None)])
    sweep.combine_rounds(unpaired)
    assert unpaired.step_s == 1.1  # alone: the fastest round
    back = sweep.rows_from_json(
        json.loads(json.dumps({"rows": [r.to_json() for r in rows]})), swept[0], swept[1]
    )
    assert [r.rounds for r in back] == [r.rounds for r in rows]


def test_the_timed_choice_is_the_fastest_measured_of_the_first_three_predicted(swept):
    base = swept[2][0]
    # predicted 1..5 s in order; measured: the model's first 2.0 s, its third 1.5 s, the
    # fifth (never timed by plan.py) the sweep's best at 1.2 s
    times = [(1.0, 2.0), (2.0, 1.8), (3.0, 1.5), (4.0, 1.6), (5.0, 1.2)]
    rows = [
        dataclasses.replace(
            base,
            name=f"p{i}",
            chosen=i == 0,
            ranked=dataclasses.replace(
                base.ranked, prediction=dataclasses.replace(base.ranked.prediction, step_s=p)
            ),
            normalized_s=m,
        )
        for i, (p, m) in enumerate(times)
    ]
    summary = sweep_summary.summarize(rows[::-1])  # the order of the rows does not matter
    assert summary["best"] == "p4" and summary["regret"] == pytest.approx(2.0 / 1.2 - 1)
    assert summary["timed_choice"] == "p2"
    assert summary["regret_timed"] == pytest.approx(1.5 / 1.2 - 1)
    # the first's layout under another remat policy, predicted last, is timed by plan.py too
    first = rows[0].ranked
    alt = "selective" if first.knobs.remat == "dots" else "dots"  # a policy it does not run
    other = dataclasses.replace(
        rows[0],
        name="p0-dots",
        chosen=False,
        ranked=dataclasses.replace(
            first,
            knobs=dataclasses.replace(first.knobs, remat=alt),
            prediction=dataclasses.replace(first.prediction, step_s=6.0),
        ),
        normalized_s=1.1,
    )
    summary = sweep_summary.summarize([*rows, other])
    assert summary["best"] == summary["timed_choice"] == "p0-dots"
    assert summary["regret_timed"] == 0.0


def test_a_sweep_json_is_read_back_and_predicted_again(swept):
    cfg, hw, rows, _ = swept
    doc = json.loads(json.dumps({"rows": [r.to_json() for r in rows]}))
    back = sweep.rows_from_json(doc, cfg, hw)
    assert [r.name for r in back] == [r.name for r in rows]
    assert [r.compiled for r in back] == [r.compiled for r in rows]
    assert [r.normalized_s for r in back] == pytest.approx([r.normalized_s for r in rows])
    assert [r.chosen for r in back] == [r.chosen for r in rows]
    assert sweep_summary.summarize(back)["regret"] == pytest.approx(
        sweep_summary.summarize(rows)["regret"]
    )


def test_compile_cached_compiles_once(swept, tmp_path, monkeypatch):
    calls = []
    figures = swept[2][1].compiled

    def fake_compile(plan):
        calls.append(plan)
        return figures

    monkeypatch.setattr(measure, "compile_plan", fake_compile)
    plan, cache = swept[2][1].ranked.plan, Cache("compiled", tmp_path)
    assert measure.compile_cached(plan, cache) == (figures, False)
    assert measure.compile_cached(plan, cache) == (figures, True)
    assert len(calls) == 1


def test_the_cache_key_follows_what_determines_the_result():
    tensor_plan = resolve(tiny_config(data=2, tensor_row=4, tensor_mode="1d", batch_size=8), 8)
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


def test_spread_orders_every_index_with_its_prefixes_spread():
    assert sweep.spread(9) == [0, 8, 4, 2, 6, 1, 3, 5, 7]
    assert sweep.spread(0) == [] and sweep.spread(1) == [0]
    assert all(sorted(sweep.spread(n)) == list(range(n)) for n in range(40))


def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take their average rank: ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def test_a_filter_that_matches_nothing_is_a_config_error():
    cfg = tiny_config(batch_size=4, seq_len=32, devices=2)
    hw = hardware("cpu")
    with pytest.raises(ConfigError, match="matches none"):
        sweep.plans(cfg, 2, hw, budget_of(hw, 2), pattern="^nothing like this")
    with pytest.raises(ConfigError, match="not a regular expression"):
        sweep.plans(cfg, 2, hw, budget_of(hw, 2), pattern="(")


def test_every_knob_adds_each_fitting_knob_choice_after_the_planners_pick():
    cfg = tiny_config(batch_size=4, seq_len=32, devices=1)
    hw = hardware("h100")
    picked = sweep.plans(cfg, 1, hw, budget_of(hw, 1))
    every = sweep.plans(cfg, 1, hw, budget_of(hw, 1), every_knob=True)
    assert [r.name for r in picked] == [every[0].name]  # one layout: the pick, then its knobs
    names = [r.name for r in every]
    assert len(names) == len(set(names)) > 10
    assert {r.ranked.knobs.remat for r in every} >= {"none", "dots", "full"}
    assert {r.ranked.knobs.grad_accum for r in every} >= {1, 2, 4}
    steps = [r.ranked.prediction.step_s for r in every[1:]]
    assert steps == sorted(steps)
    assert all(r.ranked.prediction.memory_bytes <= budget_of(hw, 1) for r in every)


def test_sweeps_merge_by_name_the_last_measurement_winning_and_keep_the_current_plans(swept):
    cfg, hw, rows, _ = swept
    first = {"rows": [r.to_json() for r in rows]}
    again = json.loads(json.dumps(first))
    again["rows"][1]["measured_step_s"] = 9.0  # measured again later
    unmeasured = {"rows": [dict(first["rows"][0], measured_step_s=None)]}  # listed, not timed
    merged = sweep.merge_json([first, again, unmeasured])
    by_name = {r["name"]: r for r in merged["rows"]}
    assert len(merged["rows"]) == len(rows) and merged["missing"] == []
    assert by_name[rows[1].name]["measured_step_s"] == 9.0
    assert by_name[rows[0].name]["measured_step_s"] == rows[0].step_s
    # the planner's plans now: the second first (its choice), one no sweep holds
    names = [rows[1].name, "data=1 unheard of", rows[0].name]
    current = sweep.merge_json([first, again], names)
    assert [r["name"] for r in current["rows"]] == [rows[1].name, rows[0].name]
    assert [r["chosen"] for r in current["rows"]] == [True, False]
    assert current["missing"] == ["data=1 unheard of"]
    back = sweep.rows_from_json(current, cfg, hw)
    assert sweep_summary.summarize(back)["chosen"] == rows[1].name


def test_a_sweep_json_records_the_calibration_its_predictions_used(swept, tmp_path):
    """Re-predicted under another calibration a stored sweep ranks differently: its JSON names
    the figures (``--from-json`` with the calibration set reproduces them)."""
    import argparse

    from colossal_jax.auto.hardware import cpu_from
    from tests.test_planner import _script

    calibration = {"flops_per_s": 5e10, "alpha_s": 0.0, "beta_bytes_per_s": 3e8, "note": "ours"}
    record = cpu_from(calibration).record()
    assert record["peak_flops"] == 5e10 and record["source"] == "ours"
    assert record["links_alpha_s_beta"]["intra"][1] == 3e8
    assert set(record["links_alpha_s_beta"]) == {"intra", "inter", "host"}
    per_axis = dict(calibration, axes={"seq": {"alpha_s": 0.0, "beta_bytes_per_s": 2e8}})
    assert cpu_from(per_axis).record()["links_alpha_s_beta"]["seq"][1] == 2e8
    script = _script("sweep_meshes")
    rows = swept[2]
    args = argparse.Namespace(json=tmp_path / "s.json", png=None)
    script.write(rows, sweep_summary.summarize(rows), args, ["--devices", "4"], record)
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["hardware"] == json.loads(json.dumps(record))
    assert len(doc["rows"]) == len(rows)


def test_a_plan_starts_only_while_the_slowest_so_far_would_end_within_the_budget(
    swept, monkeypatch, tmp_path
):
    import time

    started: list[str] = []

    def slow(row, steps, cache, reference, round_=0):  # each plan takes 0.2 s
        started.append(row.name)
        time.sleep(0.2)
        row.step_s = 0.1

    monkeypatch.setattr(sweep, "_measure_or_fail", slow)
    rows = [
        dataclasses.replace(swept[2][0], name=f"p{i}", rounds=[], cached=False) for i in range(3)
    ]
    # the second would start at 0.2 s, inside 0.3 s, but could not end before 0.4 s
    assert not sweep.run_sweep(rows, 1, cache=Cache("t", tmp_path), time_budget=0.3)
    assert len(started) == 1

    # with replay a cached plan counts the seconds its timing took when it was timed: a run
    # with the cache warm stops where the cold one did; without, it reads every cached plan
    def cached(row, steps, cache, reference, round_=0):
        started.append(row.name)
        row.cached, row.cost_s, row.step_s = True, 0.2, 0.1

    monkeypatch.setattr(sweep, "_measure_or_fail", cached)
    for replay, n in ((True, 1), (False, 3)):
        started.clear()
        rows = [
            dataclasses.replace(swept[2][0], name=f"p{i}", rounds=[], cached=False)
            for i in range(3)
        ]
        sweep.run_sweep(rows, 1, cache=Cache("t", tmp_path), time_budget=0.3, replay=replay)
        assert len(started) == n
