"""Choosing among the best-predicted plans by timing them on the devices they will run on.

The cost model ranks every plan in well under a minute, but its error on this machine's
simulated CPU devices is larger than the gaps between the leading plans (docs/planner.md: the
CPU's costs by microbatch size and attention block size are measured effects the model does not
carry; llama-tiny's fastest plan is the model's third). :func:`time_best` takes the ``k`` plans
the model ranks first and runs them as a small measured sweep (:func:`colossal_jax.auto.sweep.
run_sweep`: each built, its state initialised, one warm-up step and the median of ``steps``
timed ones; on the CPU paired with the model's first plan as the reference; kept in the disk
cache keyed by the plan, JAX, the devices, the source and the reference, so a second search
reads them), drops those that failed or whose compiled peak is over the budget, and puts the
fastest measured first. What the step costs on these devices then decides among the leading
plans; the model still decides which plans lead. Beside them it times the model's first layout
under the best-predicted other remat policy (:func:`colossal_jax.auto.search.other_remat`, when
the caller passes it): the knob on which the CPU's measured step and the model disagree most
(docs/planner.md, "Limits"), so a measurement, not the model's remat price, settles it for the
leading layout. It times on the devices this process has, so
it serves a search for those devices (the simulated CPU devices of ``scripts/plan.py --device
cpu``, or a run's own GPUs through :func:`colossal_jax.auto.choose.auto_plan`), not a cluster
planned from here.

Cost: ``k`` builds and compiles plus ``(steps + 1)·k`` steps (``k + 1`` with the remat
alternative), and when paired
:data:`~colossal_jax.auto.sweep.REFERENCE_STEPS` reference steps between consecutive plans and
before the first (one set is one plan's after and the next's before).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from colossal_jax.auto.search import GB, Ranked, SearchResult
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.plan import Devices

if TYPE_CHECKING:
    from colossal_jax.auto.sweep import Row

MEASURE_STEPS = 3
"""Timed steps per plan (their median; one warm-up step before them)."""

MEASURE_TIME_BUDGET = 80.0
"""Seconds ``scripts/plan.py`` gives the timing of its leading plans when no ``--time-budget``
is given: the 4-layer GPT's four (about 16 s each on the host of 2026-12-03) fit, and on a host
2.5× slower the cold run stays within two minutes with fewer timed (docs/planner.md). A plan
starts only while the slowest timed so far would end within it, a cached plan counting the
seconds its timing took (:func:`colossal_jax.auto.sweep.run_sweep` with ``replay``), so a
second run times and chooses as the first did."""

UNTIMED = "the time budget ended before it was timed"
"""Why a leading plan has no measured time when the time budget ran out first."""

NONE_TIMED = "the time budget ended before a leading plan was timed: chosen by the model alone"
"""The line :func:`time_best` reports when no leading plan was timed within its time budget."""


@dataclass(frozen=True)
class Timed:
    """One timed candidate: its rank by the model (0 first), its measured seconds per step
    (normalised by the reference when paired; None when it failed or its compiled peak is over
    the budget), its compiled peak bytes per device (None when it failed), why it was not
    counted (else None), and whether its figures came from the disk cache."""

    ranked: Ranked
    rank: int
    seconds: float | None
    peak_bytes: float | None
    why_not: str | None
    cached: bool
    alternative: bool = False


def time_best(
    result: SearchResult,
    k: int,
    budget: float,
    steps: int = MEASURE_STEPS,
    devices: Devices | None = None,
    time_budget: float | None = None,
    alternative: Ranked | None = None,
) -> tuple[list[Timed], list[str]]:
    """Time the ``k`` best-predicted plans of ``result`` (this module's docstring; bound to
    ``devices`` first when given, a run's own) and reorder ``result.ranked``: the timed plans that
    ran and fit by measured time first, then the untimed rest in predicted order. On simulated CPU
    devices the timings are paired with the model's first plan as the reference
    (:func:`colossal_jax.auto.sweep.run_sweep`: reference steps before and after each, the ratio
    times the reference's median), since the shared host's speed drifts by ±10% within minutes; on
    GPUs each plan is timed alone (a reference would hold a second state in memory).
    ``alternative``: a plan timed after the leading ones and counted with them (the first's layout
    under another remat policy, :func:`colossal_jax.auto.search.other_remat`; its place in the
    model's order is not the first ``k``; timed when ``k`` is 2 or more). ``time_budget``: seconds
    the timings may take; a plan not started by then stays untimed, and when none was timed the
    model's order stands (the lines say so). Returns the timed candidates (model order, the
    alternative last) and the lines that report them. Raises :class:`ConfigError` when ``k`` or
    ``steps`` is below 1, or when every timed plan failed or compiled over ``budget``."""
    from colossal_jax.auto import sweep
    from colossal_jax.checks.resolve import bind

    if k < 1:
        raise ConfigError(f"--measure {k} must be at least 1 (e.g. --measure 6)")
    if steps < 1:
        raise ConfigError(f"steps={steps} must be at least 1 to time a plan (e.g. 3)")
    leading = list(result.ranked[:k])
    # with k = 1 the model's first is timed alone, as asked
    extra = (
        [alternative] if k > 1 and alternative is not None and alternative not in leading else []
    )
    leading += extra
    rows = [
        sweep.Row(r.name, r if devices is None else replace(r, plan=bind(r.plan, devices)), i == 0)
        for i, r in enumerate(leading)
    ]
    paired = all(row.ranked.plan.devices.platform == "cpu" for row in rows)
    if time_budget is not None and time_budget <= 0:
        return [], [NONE_TIMED]
    sweep.run_sweep(rows, steps, paired=paired, time_budget=time_budget, replay=True)
    timed = [_timed(r, rank, rows[rank], budget) for rank, r in enumerate(leading)]
    if extra:
        timed[-1] = replace(timed[-1], alternative=True)
    ran = sorted((t for t in timed if t.seconds is not None), key=lambda t: t.seconds)
    untimed = [t.ranked for t in timed if t.why_not == UNTIMED]
    if not ran and not untimed:
        why = "; ".join(f"{t.ranked.name}: {t.why_not}" for t in timed)
        raise ConfigError(
            f"none of the best {len(timed)} plans ran within the budget {budget / GB:.2f} GB "
            f"per device ({why}); give more --memory-gb or more --devices"
        )
    rest = [r for r in result.ranked[k:] if r not in extra]
    result.ranked[:] = [t.ranked for t in ran] + untimed + rest
    return timed, report(timed, ran[0] if ran else None, steps, paired)


def _timed(ranked: Ranked, rank: int, row: Row, budget: float) -> Timed:
    """A measured sweep row as a :class:`Timed` candidate."""
    peak = None if row.compiled is None else row.compiled.peak_bytes
    seconds, why = row.seconds, None
    if row.error is None and seconds is None:
        why = UNTIMED
    elif row.error is not None:
        seconds, why = None, f"failed: {row.error}"
    elif peak is not None and peak > budget:  # it would not fit: its time does not count
        seconds, why = None, f"compiled over the budget ({peak / GB:.2f} GB), not counted"
    return Timed(ranked, rank, seconds, peak, why, row.cached)


def report(timed: list[Timed], fastest: Timed | None, steps: int, paired: bool) -> list[str]:
    """The lines of :func:`time_best`: each timed plan, predicted against measured, and the
    choice (``fastest`` None: none was timed before the time budget ended)."""
    cached = sum(t.cached for t in timed)
    how = "paired with the first as the reference, " if paired else ""
    k = sum(not t.alternative for t in timed)
    what = "best-predicted plan" if k == 1 else f"{k} best-predicted plans"
    if k < len(timed):
        what += " and the first's layout under another remat policy"
    lines = [
        f"timed the {what} on this process's devices ({how}median "
        f"of {steps} steps after a warm-up{f'; {cached} from the cache' if cached else ''}):"
    ]
    for t in timed:
        p = t.ranked.prediction
        measured = f"measured {t.seconds * 1e3:8.1f} ms" if t.seconds is not None else t.why_not
        place = " +" if t.alternative else f"{t.rank + 1:>2}"
        lines.append(f"  {place} {t.ranked.name:64} predicted {p.step_s * 1e3:8.1f} ms  {measured}")
    if fastest is None or fastest.seconds is None:
        return [*lines, NONE_TIMED]
    chosen = f"chosen by measurement: {fastest.ranked.name} ({fastest.seconds * 1e3:.1f} ms"
    first = timed[0]
    if fastest is first:
        lines.append(f"{chosen}, also the model's first)")
    elif first.seconds is None:
        lines.append(f"{chosen}; the model's first: {first.why_not})")
    else:
        gain = first.seconds / fastest.seconds - 1
        which = (
            "the first's remat alternative"
            if fastest.alternative
            else (f"the model's #{fastest.rank + 1}")
        )
        lines.append(
            f"{chosen}, {which}; {gain:.0%} faster than the model's "
            f"first, {first.seconds * 1e3:.1f} ms)"
        )
    return lines
