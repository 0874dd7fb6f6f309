"""The measured sweep: every plan the planner ranks for a model on ``n`` devices compiled and
(with ``steps``) run, beside its prediction — the planner checked against measurement.

The plans are those of :func:`colossal_jax.auto.search.search`: every layout the rules accept,
each with the memory knobs the planner chose for it under the budget (so the planner's choice,
the first of them, is among the measured). For each, one compile of the train step
(:func:`colossal_jax.auto.measure.measure_plan`, cached on disk) gives its compiled figures;
with ``steps`` it then runs one warm-up step and ``steps`` timed ones (the median is its step
time). What the sweep reports (:func:`colossal_jax.auto.sweep_summary.summarize`):

- the Spearman rank correlation of predicted and measured step time;

On a shared machine the load changes while a sweep runs (here: load averages of 5 to 30 on 2
cores), and a plan's step time scales with it. With ``paired`` (the default of
``scripts/sweep_meshes.py``) the planner's choice is kept compiled as a *reference*, and one
reference's median of :data:`REFERENCE_STEPS` steps is taken just before and just after each
plan is measured (one such set serving as one plan's after and the next plan's before, when
nothing ran between); a plan's *relative* time is its median step over the mean of those
two, and its *normalised* time that ratio times the reference's median over the sweep.
Rankings, the correlation and the regret use the relative times (raw times are kept beside
them). With ``rounds`` the whole sweep is timed that many times over and each plan keeps its
median round (paired; unpaired its fastest); the summary gives the first round's correlation
and regret beside.
- the memory error of each plan, ``|predicted − compiled peak| / compiled peak`` (the compiled
  peak: ``argument + output − alias + temp`` bytes of ``memory_analysis()``), and its largest;
- the regret: the measured step time of the planner's choice over the best measured, minus 1.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colossal_jax.auto import search as search_
from colossal_jax.auto.cache import Cache, plan_key
from colossal_jax.auto.hardware import Hardware
from colossal_jax.auto.measure import Compiled, Stepper, measure_plan
from colossal_jax.auto.search import Ranked, search
from colossal_jax.checks.resolve import resolve
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.schema import TrainConfig

MIB = 2**20


@dataclass
class Row:
    """One plan of the sweep: its name, prediction, measured figures (None until measured, or
    when it failed: ``error``), and whether they came from the cache."""

    name: str
    ranked: Ranked
    chosen: bool
    compiled: Compiled | None = None
    step_s: float | None = None
    error: str | None = None
    cached: bool = False
    reference_s: float | None = None
    normalized_s: float | None = None
    rounds: list[tuple[float, float | None]] = dataclasses.field(default_factory=list)
    """Every round's ``(step_s, reference_s)``; ``step_s`` and ``reference_s`` are the kept
    round's (:func:`combine_rounds`)."""
    cost_s: float | None = None
    """Seconds measuring the plan took (a cached row's: when it was measured; None when the
    cache did not record it)."""

    @property
    def seconds(self) -> float | None:
        """The step time the sweep ranks by: normalised when paired, else measured."""
        return self.normalized_s if self.normalized_s is not None else self.step_s

    @property
    def relative(self) -> float | None:
        """The step time over the reference's around it (None unpaired or unmeasured)."""
        if self.step_s is None or not self.reference_s:
            return None
        return self.step_s / self.reference_s

    @property
    def memory_error(self) -> float | None:
        if self.compiled is None or self.compiled.peak_bytes <= 0:
            return None
        pred = self.ranked.prediction.memory_bytes
        return abs(pred - self.compiled.peak_bytes) / self.compiled.peak_bytes

    def to_json(self) -> dict[str, Any]:
        p = self.ranked.prediction
        return {
            "name": self.name,
            "chosen": self.chosen,
            "parallel": dataclasses.asdict(self.ranked.plan.config.parallel),
            "knobs": dataclasses.asdict(self.ranked.knobs),
            "predicted": {
                "step_s": p.step_s,
                "compute_s": p.compute_s,
                "bubble_s": p.bubble_s,
                "comm_s": p.comm_s,
                "offload_s": p.offload_s,
                "memory_bytes": p.memory_bytes,
                "axis_bytes": p.axis_bytes,
                "flops": p.flops,
            },
            "compiled": None if self.compiled is None else self.compiled.to_json(),
            "measured_step_s": self.step_s,
            "reference_s": self.reference_s,
            "relative": self.relative,
            "normalized_s": self.normalized_s,
            "rounds": [list(r) for r in self.rounds],
            "memory_error": self.memory_error,
            "error": self.error,
            "cached": self.cached,
        }


def plans(
    cfg: TrainConfig,
    n: int,
    hw: Hardware,
    budget: float,
    pattern: str | None = None,
    sample: int | None = None,
    every_knob: bool = False,
) -> list[Row]:
    """The planner's ranked plans for ``cfg`` on ``n`` devices of ``hw`` (its choice first),
    those whose name matches the regular expression ``pattern`` when given, and of those
    ``sample`` spread evenly over the predicted ranking when given (the choice always stays).
    With ``every_knob``, each layout contributes every memory-knob combination (ZeRO, remat,
    offload, accumulation) that fits ``budget`` and resolves, not only the planner's pick —
    the sweep of one device, where the layout is fixed and only the knobs vary.
    Raises :class:`ConfigError` when no plan fits or ``pattern`` is not a valid expression or
    matches nothing."""
    result = search(cfg, n, hw, budget)
    if not result.ranked:
        raise ConfigError(
            f"no plan for --model {cfg.model} fits {budget / MIB:.0f} MiB per device on {n} "
            "devices; raise the budget or use more devices"
        )
    if every_knob:
        result.ranked[:] = search_.every_knob(result.ranked, hw, budget, n)
    try:
        keep = re.compile(pattern) if pattern else None
    except re.error as e:
        raise ConfigError(f"--filter {pattern!r} is not a regular expression ({e})") from None
    rows = []
    for i, r in enumerate(result.ranked):
        name = r.name
        if i == 0 or keep is None or keep.search(name):
            rows.append(Row(name=name, ranked=r, chosen=i == 0))
    if keep is not None and len(rows) == 1 and not keep.search(rows[0].name):
        raise ConfigError(
            f"--filter {pattern!r} matches none of the {len(result.ranked)} plans (names look "
            f"like {result.ranked[-1].name!r})"
        )
    if sample is not None and len(rows) > sample:
        if sample < 2:
            raise ConfigError(f"--sample {sample} must be at least 2 (e.g. --sample 40)")
        picks = sorted({round(i * (len(rows) - 1) / (sample - 1)) for i in range(sample)})
        rows = [rows[i] for i in picks]
    return rows


def run_sweep(
    rows: list[Row],
    steps: int,
    cache: Cache | None = None,
    progress: Callable[[Row], None] | None = None,
    paired: bool = False,
    time_budget: float | None = None,
    rounds: int = 1,
    replay: bool = False,
) -> bool:
    """Measure the rows in place: compiled figures and, with ``steps``, the median of ``steps``
    steps after a warm-up (with ``paired``, between two steps of the reference, the first
    row's plan: the module docstring). Results come from and go to ``cache`` (default
    ``Cache("measured")``). A plan that fails to compile or run keeps its error and the sweep
    goes on. ``progress`` is called after each row.

    The rows are measured in :func:`spread` order, so a sweep cut short — ``time_budget``
    seconds passed, or an interrupt (Ctrl-C) — has measured plans spread over the whole
    ranking; the others stay unmeasured. A plan is not started when the slowest plan
    measured so far would no longer end within ``time_budget``, so the budget bounds the
    sweep's own time on a slow host too. With ``replay`` a plan read from the cache counts the
    seconds its measuring took when it was measured, so a run with the cache warm makes the
    same choices as the cold run it repeats (and takes none of that time). With ``rounds``
    above 1 the whole order is timed again that many times and each plan keeps one round's
    times (:func:`combine_rounds`: the median relative time when paired). Returns whether
    every row was measured in every round."""
    import jax

    cache = cache if cache is not None else Cache("measured")
    reference = _Reference(rows[0].ranked.plan, rows[0].name) if paired and steps > 0 else None
    done, spent, slowest = 0, 0.0, 0.0
    rounds = max(1, rounds) if steps > 0 else 1
    try:
        for r in range(rounds):
            for row in (rows[i] for i in spread(len(rows))):
                if time_budget is not None and spent + slowest > time_budget:
                    raise TimeoutError
                began = time.perf_counter()
                if row.error is None:
                    _measure_or_fail(row, steps, cache, reference, r)
                took = time.perf_counter() - began
                if row.cached and replay and row.cost_s is not None:
                    took = row.cost_s
                spent += took
                if not row.cached or replay:
                    slowest = max(slowest, took)
                jax.clear_caches()
                done += 1
                if progress is not None:
                    progress(row)
    except KeyboardInterrupt:
        print(f"interrupted: {done} of {len(rows) * rounds} plan timings", file=sys.stderr)
    except TimeoutError:
        pass
    for row in rows:
        combine_rounds(row)
    normalize(rows)
    return done == len(rows) * rounds


def combine_rounds(row: Row) -> None:
    """Set ``row``'s step and reference times to those of one of its rounds: when paired, the
    round of the median relative time (step over the reference around it; the lower middle
    of an even count) — the least would favour a round whose reference was slowed, a ratio's
    noise being in its denominator too; unpaired, the round of the least step time
    (interference on the shared cores only ever adds time)."""
    if not row.rounds:
        return
    if all(ref for _, ref in row.rounds):
        ranked = sorted(row.rounds, key=lambda r: r[0] / r[1])
        row.step_s, row.reference_s = ranked[(len(ranked) - 1) // 2]
    else:
        row.step_s, row.reference_s = min(row.rounds, key=lambda r: r[0])


def spread(n: int) -> list[int]:
    """``0 … n−1`` in an order whose every prefix is spread over the range: 0 and n−1 first,
    then the midpoints of ever finer halvings (for 9: 0, 8, 4, 2, 6, 1, 3, 5, 7)."""
    if n <= 0:
        return []
    order = list(dict.fromkeys((0, n - 1)))
    parts = 2
    while len(order) < n:
        order += [i for i in (round(k * (n - 1) / parts) for k in range(parts)) if i not in order]
        order = list(dict.fromkeys(order))
        parts *= 2
    return order


def _measure_or_fail(
    row: Row, steps: int, cache: Cache, reference: _Reference | None, round_: int = 0
) -> None:
    """:func:`_measure`, or the row's error when its plan fails to compile or run."""
    try:
        _measure(row, steps, cache, reference, round_)
    except Exception as e:  # one plan's failure is a result of the sweep, not its end
        if reference is not None:
            reference.forget()
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(f"warning: {row.name}: {row.error}", file=sys.stderr)


REFERENCE_STEPS = 3
"""Steps of the reference plan timed before and after each plan of a paired sweep (their
median each): one step alone moved by ±18% on a quiet 2-core machine."""


class _Reference:
    """The reference plan of a paired sweep, compiled (and warmed up) at its first use."""

    def __init__(self, plan: Any, name: str):
        self.plan, self.name = plan, name
        self._stepper: Stepper | None = None
        self._after: float | None = None

    def stepper(self) -> Stepper:
        """The reference's compiled step, warmed up."""
        if self._stepper is None:
            self._stepper = Stepper(self.plan)
            self._stepper.time(1)  # the warm-up
        return self._stepper

    def step(self) -> float:
        """The median seconds of :data:`REFERENCE_STEPS` reference steps."""
        return self.stepper().time(REFERENCE_STEPS)

    def before(self) -> float:
        """The reference's median before a plan: the previous plan's :meth:`after` when nothing
        was timed since (the same steps serve both neighbours), else :meth:`step`."""
        if self._after is not None:
            t, self._after = self._after, None
            return t
        return self.step()

    def after(self) -> float:
        """The reference's median after a plan, kept as the next plan's :meth:`before`."""
        self._after = self.step()
        return self._after

    def forget(self) -> None:
        """Something ran since :meth:`after` (a plan that failed): the next plan times its own
        :meth:`before`."""
        self._after = None


def normalize(rows: list[Row]) -> None:
    """Set each row's normalised time (its relative time × the reference's median over the
    rows) when every timed row was paired; otherwise leave them None."""
    timed = [r for r in rows if r.step_s is not None]
    if not timed or any(r.reference_s is None for r in timed):
        return
    scale = statistics.median(r.reference_s for r in timed)
    for r in timed:
        r.normalized_s = r.step_s / r.reference_s * scale


def _measure(
    row: Row, steps: int, cache: Cache, reference: _Reference | None, round_: int = 0
) -> None:
    """Fill ``row`` from ``cache``, or measure it (between two reference steps when given),
    adding round ``round_``'s times to :attr:`Row.rounds` (later rounds have keys of their
    own)."""
    extra = (steps, reference.name, REFERENCE_STEPS) if reference is not None else (steps,)
    if round_ > 0:
        extra = (*extra, "round", round_)
    key, parts = plan_key(row.ranked.plan, "paired" if reference else "measured", *extra)
    hit = cache.get(key)
    t0 = time.perf_counter()
    if hit is not None:
        row.compiled = Compiled.from_json(hit["compiled"])
        row.step_s, row.reference_s, row.cached = hit["step_s"], hit.get("reference_s"), True
        row.cost_s = hit.get("seconds")
    else:
        before = reference.before() if reference is not None else None
        if reference is not None and row.ranked.plan is reference.plan:  # compiled already
            stepper = reference.stepper()
            row.compiled, row.step_s = stepper.figures, stepper.time(steps)
        else:
            row.compiled, row.step_s = measure_plan(row.ranked.plan, steps)
        if reference is not None and before is not None:
            row.reference_s = (before + reference.after()) / 2
        row.cost_s = time.perf_counter() - t0
        value = {"compiled": row.compiled.to_json(), "step_s": row.step_s}
        cache.put(
            key, {**value, "reference_s": row.reference_s, "seconds": row.cost_s}, about=parts
        )
    if row.step_s is not None:
        row.rounds.append((row.step_s, row.reference_s))


def merge_json(docs: list[dict[str, Any]], names: list[str] | None = None) -> dict[str, Any]:
    """One sweep document from several (``scripts/sweep_meshes.py --json`` files): a plan's row
    from the last document that measured it (else the last that lists it). With ``names`` (the
    planner's current plans, its choice first), only those plans, in that order, the first
    marked chosen; ``missing`` lists the names no document holds."""
    by_name: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for record in doc["rows"]:
            old = by_name.get(record["name"])
            if (
                old is None
                or record["measured_step_s"] is not None
                or old["measured_step_s"] is None
            ):
                by_name[record["name"]] = record
    merged = dict(docs[-1], missing=[])
    if names is None:
        merged["rows"] = list(by_name.values())
        return merged
    merged["rows"] = [dict(by_name[n], chosen=i == 0) for i, n in enumerate(names) if n in by_name]
    merged["missing"] = [n for n in names if n not in by_name]
    return merged


def rows_from_json(doc: dict[str, Any], cfg: TrainConfig, hw: Hardware) -> list[Row]:
    """The rows of a sweep's JSON (``scripts/sweep_meshes.py --json``) with their measured
    figures, each plan resolved again from its layout and knobs and predicted by the current
    cost model (the planner's choice stays the one made when the sweep ran)."""
    from colossal_jax.auto import cost
    from colossal_jax.auto.space import Knobs
    from colossal_jax.config.schema import ParallelConfig

    rows = []
    for record in doc["rows"]:
        knobs = Knobs(**record["knobs"])
        par = ParallelConfig(**record["parallel"])
        devices = search_.devices_of(hw, cfg.devices or 1)
        plan = resolve(knobs.apply(dataclasses.replace(cfg, parallel=par)), devices)
        row = Row(
            name=record["name"],
            ranked=Ranked(plan, knobs, cost.predict(plan, hw)),
            chosen=record["chosen"],
            step_s=record["measured_step_s"],
            error=record["error"],
            cached=True,
            reference_s=record.get("reference_s"),
            rounds=[tuple(r) for r in record.get("rounds", [])],
        )
        if record["compiled"] is not None:
            row.compiled = Compiled.from_json(record["compiled"])
        combine_rounds(row)
        rows.append(row)
    normalize(rows)
    return rows
