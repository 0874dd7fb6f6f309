"""The planner's choice put to use: the preset plan.py writes trains unchanged, --mesh auto
trains the default model (compiling its choice and taking the next plan when that is over the
budget), and --verify compiles the plans it returns once. docs/planner.md. (Beside
tests/test_planner.py so the two test workers share the planner's tests.)"""

from __future__ import annotations

import contextlib
import io
import time

import pytest

from colossal_jax.auto import hardware, memory
from colossal_jax.auto.choose import preset_text
from colossal_jax.auto.search import search
from colossal_jax.cli import main
from colossal_jax.config import ConfigError, TrainConfig, parse_mesh
from tests.test_planner import _cfg, _script

PLANNED = ["--devices", "8", "--batch-size", "16", "--seq-len", "128", "--measure", "1"]
"""plan.py on the default run's batch and sequence (--mesh auto's search below reads its
compiles), choosing by timing the model's first (``--measure 1``: really built, run and timed)."""


def _quietly(f, *args) -> tuple[object, str]:
    """``f(*args)`` and what it printed to stdout (module fixtures have no ``capsys``)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = f(*args)
    return result, buf.getvalue()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """plan.py's cold run with ``--out``: its preset and what it printed. Set up by the first
    test below, which runs beside the other worker's tests; only the warm rerun is timed alone
    (``quiet``)."""
    out = tmp_path_factory.mktemp("preset") / "plan.toml"
    code, printed = _quietly(_script("plan").main, [*PLANNED, "--out", str(out)])
    assert code == 0
    return out, printed


def test_written_preset_trains_unchanged(written, capsys):
    """The preset of the plan chosen by timing the model's first trains unchanged."""
    out, first = written
    assert "timed the best-predicted plan on" in first and "paired with the first" in first
    timed = [x for x in first.splitlines() if x.startswith("   1 ") and "ms  measured" in x]
    chosen = next(x for x in first.splitlines() if x.startswith("planned: "))
    assert len(timed) == 1 and ", measured " in chosen
    text = out.read_text()
    assert "[mesh]" in text and "[train]" in text
    assert "measured" in text.splitlines()[1]  # the preset's header says it
    sizes = parse_mesh(str(out), 8)
    assert sizes["data"] * sizes.get("pipe", 1) * sizes.get("seq", 1) >= 1
    code = main(
        [
            "--mesh",
            str(out),
            "--steps",
            "2",
            "--seq-len",
            "128",
            "--batch-size",
            "16",
            "--eval-every",
            "0",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "done: steps 0->2" in printed.out + printed.err


@pytest.mark.quiet
def test_the_plan_and_its_timing_are_read_back_from_the_cache_quickly(written):
    """Run again, plan.py takes its compiles and its timing from the disk cache: under 10 s,
    the same plan and times."""
    _, first = written
    chosen = next(x for x in first.splitlines() if x.startswith("planned: "))
    t0 = time.perf_counter()
    code, again = _quietly(_script("plan").main, PLANNED)
    assert code == 0 and time.perf_counter() - t0 < 10
    assert "1 from the cache" in again
    planned = next(x for x in again.splitlines() if x.startswith("planned: "))
    assert planned.split(";")[0] == chosen.split(";")[0]  # the same plan and times


def test_preset_text_carries_the_pipeline_and_knobs(tmp_path):
    # the search of the --verify test below (its compiles are on disk)
    result = search(_cfg(), 8, hardware.hardware("cpu"), budget=2**40)
    piped = next(r for r in result.ranked if r.plan.config.parallel.pipe > 1)
    path = tmp_path / "p.toml"
    path.write_text(preset_text(piped, "test"))
    sizes = parse_mesh(str(path), 8)
    par = piped.plan.config.parallel
    assert sizes["pipeline"] == par.pipeline and sizes["microbatches"] == par.num_microbatches


def test_mesh_auto_trains_the_default_model(capsys):
    code = main(["--mesh", "auto", "--steps", "2", "--eval-every", "0", "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert "planned: " in err and "runner-up: " in err


def test_mesh_auto_refuses_a_mode_flag(capsys):
    assert main(["--mesh", "auto", "--zero", "1", "--steps", "1"]) == 2
    assert "--mesh auto chooses" in capsys.readouterr().err


VERIFIED = ["--devices", "8", "--batch-size", "8", "--seq-len", "64", "--verify", "1"]
VERIFIED += ["--measure", "0"]  # the compile alone
"""plan.py on ``_cfg``'s batch and sequence, whose layer figures the searches above put on disk,
confirming its first plan by compiling it."""


@pytest.fixture(scope="module")
def verified():
    """plan.py's first ``--verify 1`` run: what it printed (set up beside the other worker's
    tests; the rerun below is timed alone)."""
    code, printed = _quietly(_script("plan").main, VERIFIED)
    assert code == 0
    return printed


def test_verify_compiles_the_plan_it_returns(verified):
    from colossal_jax.auto.cache import Cache

    line = next(x for x in verified.splitlines() if x.startswith("compiled "))
    assert ", compile" in line and any(Cache("compiled").folder.glob("*.json"))


@pytest.mark.quiet
def test_verify_compiles_once_then_reads_the_cache(verified):
    t0 = time.perf_counter()
    code, second = _quietly(_script("plan").main, VERIFIED)
    assert code == 0 and time.perf_counter() - t0 < 10
    line = next(x for x in verified.splitlines() if x.startswith("compiled "))
    assert line.split(", compile")[0] in second


def test_unknown_device_is_a_config_error():
    with pytest.raises(ConfigError, match="--device 'tpu' is unknown"):
        hardware.hardware("tpu")


def test_verify_drops_a_plan_that_compiles_over_the_budget_and_compiles_the_next(monkeypatch):
    """``--verify`` walks the ranking: the best plan's compiled peak over the budget drops it,
    the next is compiled and kept with its compiled memory; none fitting is one ConfigError."""
    from colossal_jax.auto import measure
    from colossal_jax.auto.measure import Compiled

    plan_py = _script("plan")
    result = search(_cfg(), 8, hardware.hardware("cpu"), budget=2**40)
    first, second = result.ranked[0].name, result.ranked[1].name
    peaks = {first: 5e9, second: 1e9}

    def fake(plan, cache=None):
        name = next(r.name for r in result.ranked if r.plan is plan)
        return Compiled(0, 0, 0, 0, 0, peaks.get(name, 9e9), {}, 0.1), False

    monkeypatch.setattr(measure, "compile_cached", fake)
    lines = plan_py.verify(result, 1, 8, budget=2e9)
    assert "dropped" in lines[0] and first in lines[0] and "dropped" not in lines[1]
    assert result.ranked[0].name == second and result.ranked[0].prediction.memory_bytes == 1e9
    with pytest.raises(ConfigError, match="compiled over the budget"):
        plan_py.verify(result, 1, 8, budget=1e8)


def test_mesh_auto_compiles_the_choice_and_takes_the_next_plan_when_it_is_over(monkeypatch):
    from colossal_jax.auto import choose, measure
    from colossal_jax.config.plan import Devices

    cfg = _cfg(devices=8)
    hw = hardware.hardware("cpu")
    result = search(cfg, 8, hw, choose.budget_of(hw, 8))
    first, second = result.ranked[0].name, result.ranked[1].name
    compiled = []

    def fake(plan, cache=None):
        compiled.append(plan)
        peak = 2e9 if len(compiled) == 1 else 1e6  # the first plan compiles over 1 GB
        return measure.Compiled(0, 0, 0, 0, 0, peak, {}, 0), False

    monkeypatch.setattr(measure, "compile_cached", fake)
    devices = Devices(count=8, platform="cpu")
    lines = choose.verify_on(result, devices, budget=1e9)  # no hardware: the ranked layouts only
    assert len(compiled) == 2 and result.best.name == second
    assert lines and first in lines[0] and "over the budget" in lines[0]
    with pytest.raises(ConfigError, match="all compile over"):
        choose.verify_on(result, devices, budget=1.0, limit=2)


def test_on_one_device_a_choice_over_the_budget_falls_back_to_another_knob(monkeypatch):
    from colossal_jax.auto import choose, measure
    from colossal_jax.config.plan import Devices

    cfg = _cfg(devices=1)
    hw = hardware.hardware("h100")
    result = search(cfg, 1, hw, choose.budget_of(hw, 1))
    assert len(result.ranked) == 1  # one layout: the planner's knobs for it
    first = result.best

    def fake(plan, cache=None):  # every plan keeping all activations compiles over the budget
        peak = 2e9 if plan.remat == "none" else 1e6
        return measure.Compiled(0, 0, 0, 0, 0, peak, {}, 0), False

    monkeypatch.setattr(measure, "compile_cached", fake)
    lines = choose.verify_on(result, Devices(count=1, platform="gpu"), 1e9, hw, limit=8)
    assert first.plan.remat == "none" and result.best.plan.remat != "none"
    assert lines[0].startswith(f"compiled {first.name}:")


def _gpu_ranking(offload: bool):
    """A bf16 GPU ranking of one-device plans, the first with offloaded state or without, and the
    first's prediction as the CPU compiles it above the GPU's."""
    plan_py = _script("plan")
    cfg = TrainConfig.for_model("gpt2-tiny", batch_size=8, seq_len=64, precision="bf16")
    result = search(cfg, 1, hardware.hardware("h100"), budget=2**40)
    ranked = _every_knob_of(result, cfg)
    ranked.sort(key=lambda r: (r.plan.offload != "none") != offload)  # stable: rank order kept
    result.ranked[:] = ranked
    best = result.ranked[0]
    assert (best.plan.offload != "none") == offload
    gpu, cpu = best.prediction.memory_bytes, memory.memory_bytes(plan_py._on_cpu(best.plan))
    assert cpu > gpu  # fp32 activations (and offloaded state) in the CPU's device memory
    return plan_py, result, best, (gpu + cpu) / 2


def _fake_compiles(monkeypatch, peak_of):
    from colossal_jax.auto import measure
    from colossal_jax.auto.measure import Compiled

    compiled = []

    def fake(plan, cache=None):
        compiled.append(plan)
        return Compiled(0, 0, 0, 0, 0, peak_of(plan), {}, 0.1), False

    monkeypatch.setattr(measure, "compile_cached", fake)
    return compiled


def test_verify_skips_an_offloading_gpu_plan_without_compiling_it(monkeypatch):
    """Offloaded state sits in the CPU's device memory: a GPU plan that offloads and is over the
    budget as the CPU compiles it is skipped without compiling, and the next compiled."""
    plan_py, result, best, budget = _gpu_ranking(offload=True)
    compiled = _fake_compiles(monkeypatch, lambda plan: 1.0)
    lines = plan_py.verify(result, 1, 1, budget=budget)
    assert plan_py._on_cpu(best.plan) not in compiled
    assert len(compiled) == 1 and result.ranked[0].name != best.name
    assert any(line.startswith("skipped ") and "offload=" in line for line in lines)


def test_verify_keeps_a_gpu_plan_whose_cpu_compile_fits_though_its_cpu_prediction_did_not(
    monkeypatch,
):
    """The compile decides: a GPU plan predicted over the budget as the CPU compiles it but
    compiled within it is confirmed and kept first, with its compiled memory."""
    plan_py, result, best, budget = _gpu_ranking(offload=False)
    compiled = _fake_compiles(monkeypatch, lambda plan: budget / 2)
    lines = plan_py.verify(result, 1, 1, budget=budget)
    assert len(compiled) == 1 and result.ranked[0].name == best.name
    assert result.ranked[0].prediction.memory_bytes == budget / 2
    assert lines[0].startswith(f"compiled {best.name}:") and "skipped" not in lines[0]


def test_verify_skips_not_drops_a_gpu_plan_the_cpu_compile_cannot_confirm(monkeypatch):
    """Compiled over the budget where its CPU prediction was over it too, a GPU plan is neither
    confirmed nor refuted: skipped (said so), the next compiled; if none can be confirmed the
    error says so and names --verify 0."""
    plan_py, result, best, budget = _gpu_ranking(offload=False)
    first = result.ranked[0].plan
    compiled = _fake_compiles(monkeypatch, lambda plan: 2 * budget if len(compiled) == 1 else 1.0)
    lines = plan_py.verify(result, 1, 1, budget=budget)
    assert compiled[0] == plan_py._on_cpu(first) and len(compiled) == 2
    assert result.ranked[0].name != best.name
    assert "cannot confirm it: skipped" in lines[0] and "dropped" not in lines[0]
    _, result, _, budget = _gpu_ranking(offload=False)
    _fake_compiles(monkeypatch, lambda plan: 2**50)  # everything over, every CPU prediction too
    with pytest.raises(ConfigError, match="could be confirmed by compiling on the CPU"):
        plan_py.verify(result, 1, 1, budget=1.0)


def _every_knob_of(result, cfg):
    from colossal_jax.auto.search import every_knob

    return every_knob(result.ranked, hardware.hardware("h100"), 2**40, 1)
