"""The simulated CPU devices' step costs (:data:`colossal_jax.auto.hardware.CPU_STEP`) fitted to
a measured sweep: non-negative least squares of each plan's measured step time, less what the
cost model already prices (its matmuls at the calibrated FLOP rate, its bubble, its link bytes
at the calibrated β, its offload copies), on the units :func:`colossal_jax.auto.cost.cpu_terms`
counts plus every collective of the step. ``scripts/sweep_meshes.py --from-json SWEEP --fit``
prints the fit; the shipped figures are the fit of the 4-layer GPT's sweep. The two remat
figures come from layouts timed under every remat policy instead (:func:`fit_remat`,
``scripts/remat_ab.py --fit``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from colossal_jax.auto import cost
from colossal_jax.auto.hardware import CPU_STEP, Hardware

REMAT_TERMS = ("kept_byte_s", "record_tick_byte_s")
"""The figures that tell one remat policy from another (the activation bytes kept, a pipeline's
record per tick), fitted by :func:`fit_remat` to a layout timed under every policy."""

TERMS = tuple(k for k in CPU_STEP if k not in REMAT_TERMS)
"""The figures :func:`fit` fits to a sweep, in :data:`CPU_STEP`'s order (``collective_s``
first); :data:`REMAT_TERMS` are held at their shipped values there."""


def features(plan: Any, hw: Hardware) -> tuple[float, dict[str, float]]:
    """``(priced, units)``: the seconds of ``plan``'s step the cost model prices without
    :data:`TERMS` (the remat terms included), and the units each of those figures
    multiplies."""
    pred = cost.predict(plan, hw)
    traffic = cost.axis_traffic(plan)
    inner = cost._inner_sizes(plan)
    sizes = dict(zip(cost.MESH_ORDER, plan.mesh_shape, strict=True))
    link_bytes = sum(b / hw.link_of(x, inner[x], sizes[x]).beta for x, (b, _) in traffic.items())
    every = {"collective_s": float(sum(c for _, c in traffic.values())), **cost.cpu_terms(plan)}
    remat = sum(CPU_STEP[k] * every[k] for k in REMAT_TERMS)
    priced = pred.compute_s + pred.bubble_s + link_bytes + pred.offload_s + remat
    return priced, {k: every[k] for k in TERMS}


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
    """:data:`TERMS`' figures fitted to the timed rows of a sweep
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


def fit_remat(groups: list[list[tuple[Any, float]]], hw: Hardware) -> dict[str, float]:
    """:data:`REMAT_TERMS`' figures fitted to layouts each timed under several remat policies:
    ``groups`` holds, per layout, ``(plan, seconds)`` with the reference policy first. Each
    other policy's time relative to the reference, ``r``, is what the model must give: with
    ``P`` the prediction less the remat terms and ``u`` their units, ``P + u·c = r·(P₀ + u₀·c)``
    is linear in the figures ``c``, solved by non-negative least squares (the host's speed on
    the day of the timing cancels in ``r``)."""
    a, y = [], []
    for group in groups:
        (ref, ref_s), rest = group[0], group[1:]
        p0, u0 = _without_remat(ref, hw)
        for plan, seconds in rest:
            p, u = _without_remat(plan, hw)
            r = seconds / ref_s
            a.append(u - r * u0)
            y.append(r * p0 - p)
    if len(a) < len(REMAT_TERMS):
        raise ValueError(f"{len(a)} timed policies cannot fit {len(REMAT_TERMS)} figures")
    return dict(zip(REMAT_TERMS, nnls(np.array(a), np.array(y)).tolist(), strict=True))


def _without_remat(plan: Any, hw: Hardware) -> tuple[float, np.ndarray]:
    """The predicted step less the remat terms, and their units."""
    units = cost.cpu_terms(plan)
    u = np.array([units[k] for k in REMAT_TERMS])
    step = cost.predict(plan, hw).step_s
    return step - sum(CPU_STEP[k] * units[k] for k in REMAT_TERMS), u
