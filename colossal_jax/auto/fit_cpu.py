"""The simulated CPU devices' step costs (:data:`colossal_jax.auto.hardware.CPU_STEP`) fitted to
a measured sweep: non-negative least squares of each plan's measured step time, less what the
cost model already prices (its matmuls at the calibrated FLOP rate, its bubble, its link bytes
at the calibrated β, its offload copies), on the units :func:`colossal_jax.auto.cost.cpu_terms`
counts plus every collective of the step. ``scripts/sweep_meshes.py --from-json SWEEP --fit``
prints the fit; the shipped figures are the fit of the 4-layer GPT's sweep."""

from __future__ import annotations

from typing import Any

import numpy as np

from colossal_jax.auto import cost
from colossal_jax.auto.hardware import CPU_STEP, Hardware

TERMS = tuple(CPU_STEP)
"""The fitted figures, in :data:`CPU_STEP`'s order (``collective_s`` first)."""


def features(plan: Any, hw: Hardware) -> tuple[float, dict[str, float]]:
    """``(priced, units)``: the seconds of ``plan``'s step the cost model prices outside
    :data:`CPU_STEP`'s units, and the units each of its figures multiplies. The bubble counts as
    priced whole, although since 2026-11-29 it holds a share of the tick's score work and
    collectives at the current figures (:func:`colossal_jax.auto.cost.predict`): a refit takes
    that share as given."""
    pred = cost.predict(plan, hw)
    traffic = cost.axis_traffic(plan)
    inner = cost._inner_sizes(plan)
    sizes = dict(zip(cost.MESH_ORDER, plan.mesh_shape, strict=True))
    link_bytes = sum(b / hw.link_of(x, inner[x], sizes[x]).beta for x, (b, _) in traffic.items())
    units = {"collective_s": float(sum(c for _, c in traffic.values())), **cost.cpu_terms(plan)}
    return pred.compute_s + pred.bubble_s + link_bytes + pred.offload_s, units


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by elimination: solve, drop the most negative coefficient
    (fixed at 0), solve again, until none is negative."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def fit(rows: list[Any], hw: Hardware) -> dict[str, float]:
    """:data:`CPU_STEP`'s figures fitted to the timed rows of a sweep
    (:class:`colossal_jax.auto.sweep.Row`)."""
    timed = [r for r in rows if r.seconds is not None]
    if len(timed) < len(TERMS):
        raise ValueError(f"{len(timed)} timed plans cannot fit {len(TERMS)} figures")
    a, y = [], []
    for r in timed:
        priced, units = features(r.ranked.plan, hw)
        a.append([units[k] for k in TERMS])
        y.append(r.seconds - priced)
    return dict(zip(TERMS, nnls(np.array(a), np.array(y)).tolist(), strict=True))
