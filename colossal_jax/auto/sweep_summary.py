"""A sweep's verdict (``scripts/sweep_meshes.py``): the Spearman correlation of predicted and
measured step time, the memory error, the chosen and the best measured plan, the regret, and
the regret of the choice ``scripts/plan.py --device cpu`` makes by timing its leading plans
(docs/planner.md, "The sweep: predicted against measured"). The rows come from
:mod:`colossal_jax.auto.sweep`."""

from __future__ import annotations

import dataclasses
from typing import Any

from colossal_jax.auto import search as search_
from colossal_jax.auto.space import with_zero
from colossal_jax.auto.sweep import Row, normalize


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties get their average rank); nan for fewer than 2."""
    if len(xs) < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else float("nan")


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The sweep's verdict: plans measured and failed, the Spearman correlation of predicted
    and measured step time, the largest memory error (and its plan), the chosen and the best
    measured plan and the regret (None where nothing was timed), and ``regret_timed``: that of
    the fastest measured of the :data:`~colossal_jax.auto.search.LEADING` best-predicted plans
    and of the first's layout under its best-predicted other remat policy where the sweep has
    it (``timed_choice``), the choice ``scripts/plan.py --device cpu`` makes by timing them,
    as this sweep measured them."""
    ok = [r for r in rows if r.compiled is not None]
    timed = [r for r in ok if r.seconds is not None]
    worst = max(ok, key=lambda r: r.memory_error or 0.0, default=None)
    out: dict[str, Any] = {
        "plans": len(rows),
        "measured": len(ok),
        "failed": [r.name for r in rows if r.error],
        "max_memory_error": None if worst is None else worst.memory_error,
        "max_memory_error_plan": None if worst is None else worst.name,
        "within_10pct_memory": sum(1 for r in ok if (r.memory_error or 0) <= 0.10),
        "spearman": None,
        "chosen": next((r.name for r in rows if r.chosen), None),
        "best": None,
        "regret": None,
        "paired": bool(timed) and all(r.normalized_s is not None for r in timed),
    }
    if len(timed) >= 2:
        out["spearman"] = spearman(
            [r.ranked.prediction.step_s for r in timed], [r.seconds for r in timed]
        )
        out["spearman_raw"] = spearman(
            [r.ranked.prediction.step_s for r in timed], [r.step_s for r in timed]
        )
    if timed:
        best = min(timed, key=lambda r: r.seconds)
        out["best"], out["best_step_s"] = best.name, best.seconds
        chosen = next((r for r in timed if r.chosen), None)
        if chosen is not None:
            out["chosen_step_s"] = chosen.seconds
            out["regret"] = chosen.seconds / best.seconds - 1
        leading = sorted(rows, key=lambda r: r.ranked.prediction.step_s)[: search_.LEADING]
        leading += _remat_alternative(rows, leading[0])
        ran = [r for r in leading if r.seconds is not None]
        if ran:
            fastest = min(ran, key=lambda r: r.seconds)
            out["timed_choice"] = fastest.name
            out["regret_timed"] = fastest.seconds / best.seconds - 1
    n_rounds = max((len(r.rounds) for r in timed), default=0)
    if n_rounds > 1:
        out["rounds"] = n_rounds
        out["first_round"] = _round_summary(rows, 0)
    return out


def _remat_alternative(rows: list[Row], first: Row) -> list[Row]:
    """The row of ``first``'s layout under the best-predicted other remat policy, as a list of
    one (none when the sweep has no such row): :func:`colossal_jax.auto.search.other_remat`
    among the sweep's rows."""

    def layout(r: Row) -> object:
        return with_zero(r.ranked.plan.config.parallel, 0)

    remat = first.ranked.knobs.remat
    same = [r for r in rows if layout(r) == layout(first) and r.ranked.knobs.remat != remat]
    return sorted(same, key=lambda r: r.ranked.prediction.step_s)[:1]


def _round_summary(rows: list[Row], k: int) -> dict[str, Any]:
    """Spearman and regret of round ``k``'s times alone (rows without that round left out), as
    :func:`summarize` gives them."""
    alone = [
        dataclasses.replace(r, step_s=r.rounds[k][0], reference_s=r.rounds[k][1], rounds=[])
        for r in rows
        if len(r.rounds) > k
    ]
    normalize(alone)
    figures = summarize(alone)
    return {"spearman": figures["spearman"], "regret": figures["regret"]}
