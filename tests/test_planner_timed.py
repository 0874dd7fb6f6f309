"""Choosing among the best-predicted plans by timing them (colossal_jax/auto/timed.py,
``scripts/plan.py --measure K``, ``auto_plan(measure=K)``): the fastest measured of the
leading plans is chosen, one compiled over the budget is never chosen, and the report says
predicted against measured (a real plan timed by ``plan.py --measure``, then read from the
cache: tests/test_planner_presets.py::test_written_preset_trains_unchanged). docs/planner.md."""

from __future__ import annotations

import pytest

from colossal_jax.auto import hardware, measure, sweep
from colossal_jax.auto.choose import summary
from colossal_jax.auto.measure import Compiled
from colossal_jax.auto.search import every_knob, other_remat, search
from colossal_jax.auto.space import with_zero
from colossal_jax.auto.timed import NONE_TIMED, UNTIMED, time_best
from colossal_jax.config import ConfigError
from tests.test_planner import _cfg, _script


def _result():
    return search(_cfg(), 8, hardware.hardware("cpu"), budget=2**40)


def _fake(monkeypatch, seconds: dict[str, float], peaks: dict[str, float]) -> list[str]:
    """Stand in for the measured sweep of the leading plans: each plan's time and compiled peak
    by name (a time of None: the plan failed); returns the names timed, in order, and
    ``paired`` last."""
    asked: list = []

    def fake(rows, steps, cache=None, paired=False, **_):
        for row in rows:
            asked.append(row.name)
            row.compiled = Compiled(0, 0, 0, 0, 0, peaks.get(row.name, 1e6), {}, 0.1)
            if seconds[row.name] is None:
                row.compiled, row.error = None, "XlaRuntimeError: out of memory"
            else:
                row.step_s = row.normalized_s = seconds[row.name]
        asked.append(paired)
        return True

    monkeypatch.setattr(sweep, "run_sweep", fake)
    return asked


def test_the_fastest_measured_of_the_leading_plans_is_chosen(monkeypatch):
    result = _result()
    names = [r.name for r in result.ranked]
    asked = _fake(monkeypatch, dict(zip(names[:3], (0.5, 0.3, 0.4), strict=True)), {})
    timed, lines = time_best(result, 3, budget=1e9)
    assert asked == [*names[:3], True]  # the model's three best, paired on the CPU devices
    # measured order first, then the untimed rest as the model ranked them
    assert [r.name for r in result.ranked] == [names[1], names[2], names[0], *names[3:]]
    assert [t.rank for t in timed] == [0, 1, 2] and timed[1].seconds == 0.3
    assert f"chosen by measurement: {names[1]} (300.0 ms, the model's #2" in lines[-1]
    assert "67% faster than the model's first, 500.0 ms" in lines[-1]
    said = summary(result, hardware.hardware("cpu"), timed)
    assert "measured 300.0 ms" in said[0] and said[0].startswith(f"planned: {names[1]}")
    assert said[1] == f"runner-up: {names[2]}: +100.0 ms per step measured"


def test_a_timed_plan_compiled_over_the_budget_is_never_chosen(monkeypatch):
    result = _result()
    names = [r.name for r in result.ranked]
    seconds = dict(zip(names[:3], (0.1, 0.2, None), strict=True))
    _fake(monkeypatch, seconds, {names[0]: 5e9})
    timed, lines = time_best(result, 3, budget=1e9)
    kept = [r.name for r in result.ranked]
    assert result.best.name == names[1] and names[0] not in kept and names[2] not in kept
    assert (
        timed[0].seconds is None and "compiled over the budget (5.00 GB), not counted" in lines[1]
    )
    assert "failed: XlaRuntimeError: out of memory" in lines[3]
    assert "the model's first: compiled over the budget" in lines[-1]
    result = _result()
    _fake(monkeypatch, seconds, {names[0]: 5e9, names[1]: 5e9})
    with pytest.raises(ConfigError, match="none of the best 3 plans ran within the budget"):
        time_best(result, 3, budget=1e9)
    with pytest.raises(ConfigError, match="--measure 0 must be at least 1"):
        time_best(result, 0, budget=1e9)


def test_the_first_layout_under_another_remat_policy_is_timed_beside_the_leading(monkeypatch):
    result = _result()
    hw = hardware.hardware("cpu")
    first = result.ranked[0]
    alt = other_remat(first, hw, 2**40, 8)
    assert alt is not None and alt.knobs.remat != first.knobs.remat
    assert with_zero(alt.plan.config.parallel, 0) == with_zero(first.plan.config.parallel, 0)
    # the best-predicted of that layout's other policies
    same = [r for r in every_knob([first], hw, 2**40, 8)[1:] if r.knobs.remat != first.knobs.remat]
    assert alt.prediction.step_s == min(r.prediction.step_s for r in same)
    names = [r.name for r in result.ranked]
    asked = _fake(
        monkeypatch, {**dict(zip(names[:3], (0.5, 0.3, 0.4), strict=True)), alt.name: 0.25}, {}
    )
    timed, lines = time_best(result, 3, budget=1e9, alternative=alt)
    assert asked == [*names[:3], alt.name, True]  # timed after the leading three
    assert result.best is alt and timed[-1].alternative and timed[-1].seconds == 0.25
    assert [r.name for r in result.ranked[:4]] == [alt.name, names[1], names[2], names[0]]
    assert "3 best-predicted plans and the first's layout under another remat policy" in lines[0]
    assert lines[4].startswith(f"   + {alt.name}")
    assert (
        f"chosen by measurement: {alt.name} (250.0 ms, the first's remat alternative" in lines[-1]
    )


def test_a_time_budget_that_ends_keeps_the_untimed_plans_in_model_order(monkeypatch):
    result = _result()
    names = [r.name for r in result.ranked]
    budgets: list = []

    def first_only(rows, steps, cache=None, paired=False, time_budget=None, **_):
        budgets.append(time_budget)  # the budget ran out after the first plan
        rows[0].compiled = Compiled(0, 0, 0, 0, 0, 1e6, {}, 0.1)
        rows[0].step_s = rows[0].normalized_s = 0.5
        return False

    monkeypatch.setattr(sweep, "run_sweep", first_only)
    timed, lines = time_best(result, 3, budget=1e9, time_budget=7.0)
    assert budgets == [7.0] and [r.name for r in result.ranked] == names
    assert [t.why_not for t in timed] == [None, UNTIMED, UNTIMED]
    assert lines[-1].endswith("also the model's first)") and UNTIMED in lines[2]
    timed, lines = time_best(result, 3, budget=1e9, time_budget=0.0)  # none left: no timing
    assert timed == [] and lines == [NONE_TIMED] and budgets == [7.0]


@pytest.mark.parametrize(
    ("device", "argv", "k"),
    [
        ("cpu", [], 3),
        ("h100", [], 0),
        ("cpu", ["--measure", "0"], 0),
        ("cpu", ["--measure", "5"], 5),
    ],
)
def test_plan_py_times_three_on_the_cpu_devices_unless_told(monkeypatch, capsys, device, argv, k):
    plan_py = _script("plan")
    asked: list = []

    def fake(result, k, budget, time_budget=None, **_):
        asked.append((k, time_budget))
        return [], ["timed (stand-in)"]

    monkeypatch.setattr(plan_py, "time_best", fake)
    base = ["--devices", "8", "--batch-size", "8", "--seq-len", "64", "--device", device]
    assert plan_py.main([*base, *argv, "--time-budget", "60"]) == 0
    assert [a[0] for a in asked] == ([k] if k else [])
    if k:  # the search's seconds come off the budget the timing gets
        assert 0 < asked[0][1] < 60 and "timed (stand-in)" in capsys.readouterr().out


def test_auto_plan_with_measure_times_on_the_run_devices_and_logs_the_choice(monkeypatch):
    from colossal_jax.auto import choose
    from colossal_jax.config.plan import Devices

    cfg = _cfg(devices=8)
    hw = hardware.hardware("cpu")
    names = [r.name for r in search(cfg, 8, hw, choose.budget_of(hw, 8)).ranked[:2]]
    seen: list[str] = []

    def compiled(plan, cache=None):  # --mesh auto's compile of its choice: it fits
        return Compiled(0, 0, 0, 0, 0, 1e6, {}, 0.1), False

    budgets: list = []

    def timed(rows, steps, cache=None, paired=False, time_budget=None, **_):
        budgets.append(time_budget)  # the model's second runs faster
        for i, row in enumerate(rows):
            seen.append(row.ranked.plan.devices.platform)
            row.compiled = Compiled(0, 0, 0, 0, 0, 1e6, {}, 0.1)
            row.step_s = row.normalized_s = 0.2 if i == 1 else 0.4
        return True

    monkeypatch.setattr(measure, "compile_cached", compiled)
    monkeypatch.setattr(sweep, "run_sweep", timed)
    lines: list[str] = []
    devices = Devices(count=8, platform="cpu")
    plan = choose.auto_plan(cfg, devices, time_budget=None, log=lines.append, measure=2)
    # the two leading plans and the first's layout under another remat policy
    assert seen == ["cpu", "cpu", "cpu"] and plan.devices == devices
    assert lines[0].startswith(f"planned: {names[1]}") and "measured 200.0 ms" in lines[0]
    assert any(x.startswith(f"chosen by measurement: {names[1]}") for x in lines)
    # with a time budget, the timing gets what the search left of it
    choose.auto_plan(cfg, devices, time_budget=600.0, log=None, measure=2)
    assert budgets[0] is None and 0 < budgets[1] < 600
