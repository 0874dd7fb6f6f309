"""Sweeps of different days put on one scale before they are merged (auto/sweep_scale.py)."""

from __future__ import annotations

import math

import pytest

from colossal_jax.auto import sweep_scale


def _doc(times: dict[str, float | None], command: str = "") -> dict:
    rows = [
        {"name": n, "normalized_s": t, "measured_step_s": t, "reference_s": 1.0 if t else None}
        for n, t in times.items()
    ]
    return {"command": command, "rows": rows}


TRUE = {"a": 1.0, "b": 1.5, "c": 2.0, "d": 2.5, "e": 3.0}


def test_each_sweep_is_divided_by_its_scale_against_the_largest():
    big = _doc({n: t for n, t in TRUE.items() if n != "e"})  # 4 plans: the anchor
    slow = _doc({"c": 2.0 * 1.7, "d": 2.5 * 1.7, "e": 3.0 * 1.7})  # a host 1.7× slower
    fast = _doc({"a": 0.6, "e": 3.0 * 0.6, "x": None})  # reaches the anchor through ``slow``
    scales = sweep_scale.scales([slow, big, fast])
    assert scales == pytest.approx([1.7, 1.0, 0.6], rel=1e-6)
    out = sweep_scale.on_one_scale([slow, big, fast])
    for doc in out:
        for row in doc["rows"]:
            if row["name"] == "x":
                assert row["normalized_s"] is None  # untimed rows stay untimed
                continue
            assert row["normalized_s"] == pytest.approx(TRUE[row["name"]], rel=1e-6)
            assert row["rounds"] == [[row["normalized_s"], 1.0]]
    assert slow["rows"][0]["normalized_s"] == pytest.approx(3.4)  # the inputs are not changed


def test_noisy_timings_give_the_least_squares_scales():
    one = _doc({"a": 1.0, "b": 2.0})
    two = _doc({"a": 2.2, "b": 3.6})  # ratios 2.2 and 1.8: the scale is their geometric mean
    s1, s2 = sweep_scale.scales([one, two])
    assert s2 / s1 == pytest.approx(math.sqrt(2.2 * 1.8), rel=1e-6)
    assert s2 == 1.0  # a tie in plans timed: the later sweep is the anchor


def test_a_sweep_sharing_no_plan_is_named():
    with pytest.raises(ValueError, match="--from-json b.json shares no timed plan"):
        sweep_scale.scales(
            [_doc({"a": 1.0, "b": 2.0}), _doc({"z": 5.0})],
            ["--from-json a.json", "--from-json b.json"],
        )


def test_a_plan_timed_in_several_sweeps_takes_the_mean_of_its_scaled_timings():
    one = _doc({"a": 1.0, "c": 3.0, "b": 2.0 * 1.1})  # b 10% slow in this sweep
    two = _doc({"a": 1.0, "c": 3.0, "b": 2.0 / 1.1, "d": 4.0})  # and 10% fast in this one
    k1, k2 = sweep_scale.scales([one, two])
    want = math.sqrt(2.0 * 1.1 / k1 * (2.0 / 1.1) / k2)
    for doc in sweep_scale.on_one_scale([one, two]):
        b = next(r for r in doc["rows"] if r["name"] == "b")
        assert b["normalized_s"] == pytest.approx(want, rel=1e-9) and b["timings"] == 2
    d = next(r for r in sweep_scale.on_one_scale([one, two])[1]["rows"] if r["name"] == "d")
    assert d["normalized_s"] == pytest.approx(4.0 / k2) and d["timings"] == 1
