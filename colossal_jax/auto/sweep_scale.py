"""Several sweeps' step times put on one scale before they are merged.

A sweep's normalised times (:func:`colossal_jax.auto.sweep.normalize`) are its plans' times
relative to its reference, times the reference's median in that sweep: the scale is the host's
speed that day and the reference of that sweep (the planner's choice when it ran). Sweeps of
different days differ by that scale — the stored GPT sweeps by 0.47–1.28 of each other — so
rows merged from them as they are (:func:`colossal_jax.auto.sweep.merge_json`) rank a plan
partly by the day it was timed.

Method: every timed plan seen in several sweeps ties their scales. With ``t[f, n]`` plan
``n``'s time in sweep ``f``, fit ``log t[f, n] = s[f] + u[n]`` by least squares (alternating
means until the scales move less than 1e-9, at most 5,000 rounds), the sweep timing the most
plans held at ``s = 0``; each sweep's times are then divided by ``exp(s[f])``, and a
plan timed in several sweeps takes the geometric mean of its scaled timings
(:func:`on_one_scale`). A sweep that
no chain of shared plans ties to that one cannot be scaled and is named in a
:class:`ValueError`. The residuals' spread is the repeat noise of one timing (0.053 in log over
the stored GPT sweeps, 1,791 timings of 799 plans).
"""

from __future__ import annotations

import copy
import math
from typing import Any


def row_time(row: dict[str, Any]) -> float | None:
    """A sweep row's step time: normalised when the sweep was paired, else measured."""
    t = row.get("normalized_s")
    return t if t is not None else row.get("measured_step_s")


def scales(
    docs: list[dict[str, Any]], labels: list[str] | None = None, tol: float = 1e-9
) -> list[float]:
    """Each sweep's scale against the one timing the most plans (that one's is 1);
    ``labels`` name the sweeps in errors (their files)."""
    obs = [
        (i, row["name"], math.log(t))
        for i, doc in enumerate(docs)
        for row in doc["rows"]
        if (t := row_time(row)) is not None and t > 0
    ]
    timed = [sum(1 for o in obs if o[0] == i) for i in range(len(docs))]
    if not obs:
        return [1.0] * len(docs)
    anchor = max(range(len(docs)), key=lambda i: (timed[i], i))
    _check_connected(labels or [f"sweep {i + 1}" for i in range(len(docs))], obs, anchor, timed)
    per_doc = [[(name, y) for j, name, y in obs if j == i] for i in range(len(docs))]
    s = [0.0] * len(docs)
    for _ in range(5_000):
        u: dict[str, list[float]] = {}
        for i, name, y in obs:
            u.setdefault(name, []).append(y - s[i])
        mean_u = {n: sum(v) / len(v) for n, v in u.items()}
        new = [
            sum(y - mean_u[name] for name, y in mine) / len(mine) if mine else 0.0
            for mine in per_doc
        ]
        shift = new[anchor]
        new = [x - shift for x in new]
        moved = max(abs(a - b) for a, b in zip(new, s, strict=True))
        s = new
        if moved < tol:
            break
    return [math.exp(x) for x in s]


def _check_connected(
    labels: list[str], obs: list[tuple[int, str, float]], anchor: int, timed: list[int]
) -> None:
    """Raise ``ValueError`` naming a timed sweep that no chain of shared plans ties to the
    anchor sweep."""
    plans: dict[str, set[int]] = {}
    for i, name, _ in obs:
        plans.setdefault(name, set()).add(i)
    reached, frontier = {anchor}, [anchor]
    while frontier:
        i = frontier.pop()
        for _, name, _ in (o for o in obs if o[0] == i):
            for j in plans[name] - reached:
                reached.add(j)
                frontier.append(j)
    for i, n in enumerate(timed):
        if n and i not in reached:
            raise ValueError(
                f"{labels[i]} shares no timed plan with {labels[anchor]} (directly or through "
                "the other files), so its times cannot be put on their scale; merge it without "
                "--one-scale, or add a sweep that times some of its plans"
            )


def on_one_scale(
    docs: list[dict[str, Any]], labels: list[str] | None = None
) -> list[dict[str, Any]]:
    """Copies of ``docs`` whose timed rows hold their plan's time on one scale, as one round
    against a reference of 1 s (so that :func:`colossal_jax.auto.sweep.rows_from_json` reads it
    back as the normalised time): each timing divided by its sweep's :func:`scales`, and a plan
    timed in several sweeps given the geometric mean of its timings there (the fit's plan time
    ``u``: repeated timings of one plan on one scale are repeat measurements, and their mean
    is the estimate with the least noise; without ``--one-scale`` the last file's wins)."""
    ks = scales(docs, labels)
    logs: dict[str, list[float]] = {}
    for doc, k in zip(docs, ks, strict=True):
        for row in doc["rows"]:
            t = row_time(row)
            if t is not None and t > 0:
                logs.setdefault(row["name"], []).append(math.log(t / k))
    out = []
    for doc, k in zip(docs, ks, strict=True):
        doc = copy.deepcopy(doc)
        for row in doc["rows"]:
            t = row_time(row)
            if t is None or t <= 0:
                continue
            mine = logs[row["name"]]
            t = math.exp(sum(mine) / len(mine))
            row.update(
                measured_step_s=t,
                reference_s=1.0,
                normalized_s=t,
                rounds=[[t, 1.0]],
                timings=len(mine),
            )
        doc["scale"] = k
        out.append(doc)
    return out
