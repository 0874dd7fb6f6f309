"""The planner (colossal_jax/auto, scripts/plan.py, scripts/train.py --mesh auto): its space is
what the rules accept, its search respects the budget and the time budget, an impossible
request is one line and exit 2, the preset it writes trains, and --mesh auto trains.
docs/planner.md."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colossal_jax.auto import attention_memory, cost, hardware, memory, space
from colossal_jax.auto.search import impossible, search
from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cfg(**fields) -> TrainConfig:
    return TrainConfig.for_model("gpt2-tiny", batch_size=8, seq_len=64, **fields)


def test_factorizations_cover_every_ordered_split():
    got = sorted(space.factorizations(8, 4))
    assert len(got) == len(set(got)) == 20  # C(3 + 3, 3) ordered splits of 2^3 into 4 parts
    assert all(a * b * c * d == 8 for a, b, c, d in got)


def test_tensor_grids_of_eight_include_every_mode():
    modes = {mode for mode, _ in space.tensor_grids(8)}
    assert modes == {"1d", "2.5d", "3d"}  # 2d needs a square
    assert {mode for mode, _ in space.tensor_grids(4)} >= {"1d", "2d"}


def test_every_searched_plan_resolves_and_fits():
    hw = hardware.hardware("h100")
    result = search(_cfg(precision="bf16"), 4, hw, hw.memory_bytes)
    assert result.ranked and result.layouts >= len(result.ranked)
    for r in result.ranked:
        assert resolve(r.plan.config, r.plan.devices) == r.plan  # the rules accept it as is
        assert r.prediction.memory_bytes <= hw.memory_bytes
    times = [r.prediction.step_s for r in result.ranked]
    assert times == sorted(times)


def test_a_tight_budget_buys_memory_with_time():
    hw = hardware.hardware("h100")
    cfg = _cfg(precision="bf16")  # the layouts of the test above: their compiles are on disk
    roomy = search(cfg, 4, hw, 80e9).best
    tight = search(cfg, 4, hw, roomy.prediction.memory_bytes / 3).best
    assert tight.prediction.memory_bytes <= roomy.prediction.memory_bytes / 3
    assert tight.prediction.step_s >= roomy.prediction.step_s


def test_time_budget_stops_with_the_best_so_far():
    hw = hardware.hardware("h100")
    result = search(_cfg(precision="bf16"), 8, hw, 80e9, time_budget=0.0)
    assert result.stopped_early and len(result.ranked) == 1


def test_pipeline_bubble_per_schedule():
    base = _cfg()
    par = ParallelConfig(data=2, pipe=2, pipeline="1f1b", microbatches=4)
    plan = resolve(dataclasses.replace(base, parallel=par), 4)
    assert cost.bubble(plan) == pytest.approx(1 / 4)
    inter = dataclasses.replace(par, pipeline="interleaved", virtual_stages=2)
    cfg = dataclasses.replace(base, parallel=inter, model_overrides={"n_layer": 4})
    assert cost.bubble(resolve(cfg, 4)) == pytest.approx(1 / 8)
    # the zero-bubble schedules: a third of the fused schedule's (the unit tick tables); ZB-H1
    # holds 1F1B's p microbatches, each a record: the larger of the residuals and, after the
    # B, the linears' inputs and output gradients — more than `full` remat's layer input
    zb = resolve(dataclasses.replace(base, parallel=dataclasses.replace(par, pipeline="zb-h1")), 4)
    assert cost.bubble(zb) == pytest.approx(1 / 12)
    assert memory.memory_terms(zb)["pipe_kept"] >= memory.memory_terms(plan)["pipe_kept"]
    full, zb_full = (resolve(dataclasses.replace(c.config, remat="full"), 4) for c in (plan, zb))
    assert memory.memory_terms(zb_full)["pipe_kept"] > memory.memory_terms(full)["pipe_kept"]
    zbv = dataclasses.replace(inter, pipeline="zb-v")
    cfg = dataclasses.replace(base, parallel=zbv, model_overrides={"n_layer": 4})
    assert cost.bubble(resolve(cfg, 4)) == pytest.approx(1 / 24)


def test_the_bubble_idles_a_whole_ticks_work_and_on_shared_cores_not_per_stage():
    """A bubble tick idles the chunk's matmuls and the tensor and sequence traffic inside its
    layers (not the data axis's reduction, once a step); on the host's shared cores it is
    ``1/(M·V)`` of that work whatever ``p``, times the remat policy's share of the record."""
    base = dataclasses.replace(_cfg(), model_overrides={"n_layer": 4})
    par = ParallelConfig(pipe=4, tensor_row=2, tensor_mode="1d", pipeline="1f1b", microbatches=8)
    plan = resolve(dataclasses.replace(base, parallel=par), 8)
    assert cost.bubble(plan) == pytest.approx(3 / 8)
    assert cost.bubble(plan, shared=True) == pytest.approx(1 / 8)
    no_memory = {"state": 0.0, "grads": 0.0}  # the time alone: no memory model's compiles
    gpu = cost.predict(plan, hardware.hardware("h100"), no_memory)
    tick_work = gpu.compute_s + gpu.axis_s["tensor_row"]
    assert gpu.axis_s["tensor_row"] > 0
    assert gpu.bubble_s == pytest.approx(tick_work * 3 / 8)
    cpu = cost.predict(plan, hardware.hardware("cpu", None), no_memory)
    units = cost.cpu_terms(plan)
    scores = sum(hardware.CPU_STEP[k] * units[k] for k in cost.TICK_CPU_TERMS)
    # and a bubble tick there costs the remat policy's share of none's record
    work = (cpu.compute_s + cpu.axis_s["tensor_row"] + scores) / 8
    assert cpu.bubble_s == pytest.approx(work * memory.record_share(plan))
    plain = resolve(dataclasses.replace(base, parallel=par, remat="none"), 8)
    assert memory.record_share(plain) == 1.0
    for remat in ("dots", "selective", "full"):
        kept = resolve(dataclasses.replace(base, parallel=par, remat=remat), 8)
        share = memory._record_elements(kept) / memory._record_elements(plain)
        assert memory.record_share(kept) == pytest.approx(share) and 0 < share < 1


@pytest.mark.quiet
def test_impossible_request_is_one_line_and_exit_2_quickly():
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "plan.py"),
            "--model",
            "gpt3-175b",
            "--devices",
            "8",
            "--device",
            "h100",
            "--batch-size",
            "1536",
            "--seq-len",
            "2048",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    elapsed = time.perf_counter() - t0
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no plan for --model gpt3-175b")
    assert "smallest needs" in lines[0] and "--memory-gb" in lines[0]
    assert elapsed < 20


def test_impossible_names_the_plan_that_would_fit():
    hw = hardware.hardware("h100")
    cfg = _cfg(precision="bf16")
    result = search(cfg, 4, hw, 1e3)
    assert not result.ranked
    line = impossible(cfg, 4, hw, 1e3, result)
    need = float(line.split("--memory-gb ")[1].split()[0]) * 1e9
    again = search(cfg, 4, hw, need)
    assert again.ranked  # the memory the line names is enough


def test_least_memory_by_branch_and_bound_is_that_of_pricing_every_combination():
    """The impossible request's answer is found by pricing combinations in order of their memory
    floors (docs/planner.md, "The search"): the same least memory as pricing all of them, and no
    floor above its prediction (ring layouts included, whose floor leaves out the ring's
    blocks)."""
    from colossal_jax.auto.search import _variant, devices_of

    hw = hardware.hardware("cpu")
    cfg = _cfg()
    result = search(cfg, 8, hw, 1e3)
    assert not result.ranked and result.smallest is not None
    light = space.Knobs(zero=0, remat="none", offload="none", grad_accum=1)
    every, rings = [], 0
    for par in space.layouts(8, cfg.batch_size, hw.node):
        try:
            base = resolve(light.apply(dataclasses.replace(cfg, parallel=par)), devices_of(hw, 8))
        except ConfigError:
            continue
        for k in space.knobs(par, cfg.batch_size, base.batch_shards * base.microbatches):
            variant = _variant(base, k)
            need = memory.memory_bytes(variant)
            floor = memory.memory_bytes(variant, floor=True)
            assert floor <= need, (variant.config.parallel, k)
            # the search prices these by their floor's terms: it must be the prediction
            assert floor == need or not memory.floor_is_exact(variant), variant.config.parallel
            rings += floor < need
            every.append(need)
    assert rings > 0  # the floor did leave the ring's blocks out somewhere
    assert result.smallest.prediction.memory_bytes == min(every)


def test_branch_and_bound_prices_in_floor_order_until_a_floor_reaches_the_least(monkeypatch):
    """``lightest`` on made-up floors and needs: the least need is not the least floor's, and
    pricing stops at the first floor no less than the least need found."""
    from colossal_jax.auto import search as search_mod

    needs = {"a": 10.0, "b": 2.5, "c": 3.0, "d": 9.0}
    floors = {"a": 1.0, "b": 2.0, "c": 2.5, "d": 4.0}
    priced = []

    def memory_bytes(plan, floor=False):
        priced.append(plan)
        return needs[plan]

    monkeypatch.setattr(search_mod.memory, "memory_bytes", memory_bytes)
    monkeypatch.setattr(search_mod.cost, "predict", lambda plan, hw: needs[plan])
    knobs = space.Knobs(zero=0, remat="none", offload="none", grad_accum=1)
    variants = [(floors[n], knobs, n) for n in ("d", "c", "b", "a")]
    best = search_mod.lightest(variants, hardware.hardware("cpu"))
    assert best is not None and best.plan == "b" and best.prediction == 2.5
    assert priced == ["a", "b"]  # c's floor 2.5 is no less than b's 2.5: not priced
    assert search_mod.lightest([], hardware.hardware("cpu")) is None


def test_rules_refusing_every_layout_are_named_one_per_flag():
    hw = hardware.hardware("cpu")
    cfg = _cfg(precision="fp32", model_overrides={"n_layer": 2})
    result = search(cfg, 3, hw, 1e12)
    assert not result.ranked and result.smallest is None
    line = impossible(cfg, 3, hw, 1e12, result)
    assert line.startswith("no valid plan for --model gpt2-tiny")
    # each kind of rule once (batch shards, pipeline chunks, heads, the sequence), not the
    # first two layouts' variants of one
    for subject in ("--batch-size 8", "n_layer=2", "heads divisible by 3", "--seq-len 64"):
        assert line.count(subject) == 1, (subject, line)


CARELESS = [
    ("plan", ["--set", "n_layer=x"], "--set n_layer=x: 'x' is not a valid int"),
    ("plan", ["--set", "model.nlayer=3"], "did you mean 'n_layer'"),
    ("plan", ["--set", "n_layer"], "is not FIELD=VALUE"),
    ("plan", ["--top", "0"], "--top 0 must be at least 1"),
    ("plan", ["--measure", "-1"], "--measure -1 must be 0 or more"),
    ("plan", ["--time-budget", "-5"], "--time-budget -5.0 must be a positive number"),
    ("plan", ["--time-budget", "0"], "--time-budget 0.0 must be a positive number"),
    ("sweep_meshes", ["--time-budget", "0"], "--time-budget 0.0 must be a positive number"),
    ("sweep_meshes", ["--sample", "0"], "--sample 0 must be ≥ 1"),
    ("plan", ["--measure", "2", "--device", "h100"], "--measure times plans on this machine's"),
    ("plan", ["--out", "{tmp}"], "is a directory; name a file, e.g. --out"),
    ("plan", ["--out", "{text}/x.toml"], "is a file, not a directory"),
    ("sweep_meshes", ["--json", "{text}/x.json"], "is a file, not a directory"),
    ("sweep_meshes", ["--png", "{tmp}"], "is a directory; name a file, e.g. --png"),
    ("calibrate_cpu", ["--out", "{text}/cpu.json"], "is a file, not a directory"),
    ("sweep_meshes", ["--set", "n_layer=x"], "--set n_layer=x: 'x' is not a valid int"),
    ("sweep_meshes", ["--set", "foo=3"], "model has no field 'foo'"),
    ("sweep_meshes", ["--from-json", "{tmp}/none.json"], "none.json: No such file"),
    ("sweep_meshes", ["--from-json", "{text}"], "is not JSON"),
    ("sweep_meshes", ["--from-json", "{list}"], "is not a sweep's JSON"),
    ("sweep_meshes", ["--from-json", "{rowless}"], "row 0 lacks chosen"),
    ("sweep_meshes", ["--current"], "--current needs --from-json"),
    ("sweep_meshes", ["--one-scale"], "--one-scale needs --from-json"),
    # a sweep of another model or size: none of the planner's current plans is in it (the
    # batch and sequence of _cfg, whose layer figures the tests above put on disk)
    (
        "sweep_meshes",
        ["--devices", "2", "--batch-size", "8", "--seq-len", "64", "--from-json", "{foreign}"]
        + ["--current"],
        "a sweep of another model or size?",
    ),
]


@pytest.mark.parametrize(("script", "argv", "message"), CARELESS, ids=lambda x: str(x))
def test_planner_scripts_answer_careless_inputs_in_one_line(
    script, argv, message, tmp_path, capsys
):
    files = {"tmp": tmp_path, "text": tmp_path / "a.txt", "list": tmp_path / "l.json"}
    files["text"].write_text("not json")
    files["list"].write_text("[1]")
    files["rowless"] = tmp_path / "r.json"
    files["rowless"].write_text('{"rows": [{"name": "data=8"}]}')
    files["foreign"] = tmp_path / "f.json"
    row = {"name": "data=64", "chosen": True, "parallel": {}, "knobs": {}, "compiled": None}
    row |= {"measured_step_s": 1.0, "error": None}
    files["foreign"].write_text(json.dumps({"rows": [row]}))
    argv = [a.format(**files) for a in argv]
    assert _script(script).main(["--devices", "8", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def _resolved(platform: str, precision: str, **par) -> object:
    from colossal_jax.config.plan import Devices

    cfg = _cfg(precision=precision, devices=8, parallel=ParallelConfig(**par))
    return resolve(cfg, Devices(count=8, platform=platform))


def test_flash_and_ring_attention_keep_no_scores():
    a, s = 8, 64  # gpt2-tiny's heads, _cfg's sequence
    assert attention_memory.scores_per_token(_resolved("cpu", "fp32", data=8)) == a * s
    assert (
        attention_memory.scores_per_token(_resolved("gpu", "fp32", data=8)) == a * s
    )  # cuDNN needs 16-bit
    flash = _resolved("gpu", "bf16", data=8)
    assert attention_memory.flash_attention(flash) and attention_memory.scores_per_token(flash) == 0
    ulysses = _resolved("gpu", "bf16", data=2, seq=4, seq_mode="ulysses")
    assert attention_memory.scores_per_token(ulysses) == 0
    ring = _resolved("cpu", "fp32", data=2, seq=4, seq_mode="ring")
    assert attention_memory.scores_per_token(ring) == 0
    assert (
        attention_memory.scores_per_token(ring, kept=False) == a * s / 4
    )  # one block while it runs
    plain = _resolved("cpu", "fp32", data=2, seq=4, seq_mode="ulysses")
    assert memory.memory_bytes(ring) < memory.memory_bytes(plain)


def test_offloaded_state_counts_on_the_cpu_devices_and_not_on_a_gpu():
    def state(platform: str, offload: str) -> float:
        plan = _resolved(platform, "fp32", data=8)
        plan = resolve(dataclasses.replace(plan.config, offload=offload), plan.devices)
        return memory.memory_terms(plan)["state"]

    assert state("cpu", "optimizer") == state("cpu", "none")
    assert state("gpu", "optimizer") == pytest.approx(state("gpu", "none") / 3)  # Adam: 2 slots
