"""The planner's search: every layout of :mod:`~colossal_jax.auto.space`, its memory knobs chosen
under the budget, ranked by predicted step time (:mod:`~colossal_jax.auto.cost`).

For each layout, resolved once with the lightest knobs (ZeRO 0, no remat, no offload, no
accumulation; a layout the rules refuse is dropped there), every knob combination is costed
analytically (microseconds each), and they are tried fastest-first: the first that fits the
memory budget and that :func:`~colossal_jax.checks.resolve.resolve` accepts is the layout's
plan. Remat, offload, ZeRO and accumulation are thereby chosen jointly with the layout: a layout
that needs remat to fit pays for it in its predicted time and competes with one that does not.
The layouts' plans are ranked by predicted step time. A ``time_budget`` stops the search at the
next layout with the best found so far (:attr:`SearchResult.stopped_early`; it searches on
until one plan fits).

A combination is priced only when its memory floor (:func:`~colossal_jax.auto.memory.
memory_bytes` with ``floor``: no ring kernel compiled, never more than the prediction) fits
the budget. When nothing fits, the least memory any plan needs (the impossible request's
answer, :func:`impossible`) is found by branch and bound: combinations in order of their
floors, each priced until the next floor is no less than the least memory found. The memory
model's per-family figures (:mod:`~colossal_jax.auto.layer_memory`) compile a layer once per
model and sequence length, on disk after that; nothing else here compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from colossal_jax.auto import cost, memory, memory_weights, per_token_memo, space
from colossal_jax.auto.cost import Prediction
from colossal_jax.auto.hardware import Hardware
from colossal_jax.auto.space import Knobs
from colossal_jax.checks.resolve import resolve
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.plan import Devices, Plan
from colossal_jax.config.schema import TrainConfig

GB = 1e9


@dataclass(frozen=True)
class Ranked:
    """One candidate: its plan, the knobs chosen for it and its prediction."""

    plan: Plan
    knobs: Knobs
    prediction: Prediction

    @property
    def name(self) -> str:
        """The layout and its knobs, e.g. ``data=4,tensor_row=2 tp=1d zero=1 remat=dots``."""
        return f"{space.describe(self.plan.config.parallel)} {self.knobs.describe()}"


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
      ranked: the fitting plans, fastest first (one per layout).
      layouts: layouts enumerated; rejected: refused by the rules (reason → count);
      over_budget: layouts with no knob combination within the budget.
      smallest: when no candidate fits, the one of least predicted memory (else None).
      stopped_early: the time budget ended the search before every layout was seen.
      seconds: the search's wall time.
    """

    ranked: list[Ranked] = field(default_factory=list)
    layouts: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    over_budget: int = 0
    smallest: Ranked | None = None
    stopped_early: bool = False
    seconds: float = 0.0

    @property
    def best(self) -> Ranked:
        return self.ranked[0]


LEADING = 3
"""The leading plans ``scripts/plan.py --device cpu`` times unless ``--measure`` says otherwise:
on the four stored full sweeps of the GPT and llama-tiny (docs/planner.md) the fastest
measured of the model's first three was within 7% of the sweep's best (0.7%, 0%, 0%, 7.0%),
the model's first alone up to 18% off; three builds and timings keep a cold search of the
4-layer GPT on 8 devices near 90 s."""


def _variant(plan: Plan, knobs: Knobs) -> Plan:
    """``plan`` with ``knobs``, unvalidated (for costing; :func:`resolve` confirms the chosen).
    Copied rather than rebuilt: a search makes tens of thousands, and the config's field-type
    check (all it runs on construction) has nothing to check in knobs the search enumerated."""
    config = _copy(plan.config, **knobs.changes(plan.config))
    return _copy(plan, config=config, grad_accum=knobs.grad_accum)


def _copy(obj: Any, **changes: Any) -> Any:
    """A shallow copy of the frozen dataclass ``obj`` with ``changes``, not re-run through its
    constructor."""
    new = copy.copy(obj)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


def _reason(e: ConfigError) -> str:
    """A rejection's kind: the error's first clause (to ``;``), at most 100 characters."""
    text = str(e).split(";")[0]
    return text if len(text) <= 100 else text[:99] + "…"


def _one_per_subject(reasons: list[str], most: int = 5) -> list[str]:
    """The first reason of each subject (its first word: the flag or field it names, e.g.
    ``--seq-len``, ``n_layer=2``), in order, at most ``most``: one line that names every kind
    of rule a request breaks rather than the first two layouts' variants of one."""
    seen: dict[str, str] = {}
    for r in reasons:
        seen.setdefault(r.split(" ", 1)[0], r)
    return list(seen.values())[:most]


Variant = tuple[float, Knobs, Plan]
"""A knob combination of a layout, unvalidated: ``(its memory floor, knobs, plan)``."""


def best_knobs(
    base: Plan, hw: Hardware, budget: float, devices: Devices
) -> tuple[Ranked | None, list[Variant]]:
    """``(the fastest knob combination of the layout of base that fits budget and resolves,
    or None; every combination with its memory floor)``: only those whose floor fits are
    priced."""
    par = base.config.parallel
    variants: list[Variant] = []
    fitting = []
    for k in space.knobs(par, base.config.batch_size, base.batch_shards * base.microbatches):
        variant = _variant(base, k)
        terms = memory.memory_terms(variant, floor=True)
        floor = memory_weights.weighted(terms, variant.remat)
        variants.append((floor, k, variant))
        if floor > budget:
            continue
        # without a ring kernel the floor is the prediction's own memory
        pred = cost.predict(variant, hw, terms if memory.floor_is_exact(variant) else None)
        if pred.memory_bytes <= budget:
            fitting.append((pred, k))
    fitting.sort(key=lambda c: c[0].step_s)
    for pred, k in fitting:
        try:
            plan = resolve(k.apply(base.config), devices)
        except ConfigError:
            continue
        return Ranked(plan, k, pred), variants
    return None, variants


def lightest(variants: list[Variant], hw: Hardware) -> Ranked | None:
    """The combination of least predicted memory among ``variants``, by branch and bound:
    priced in order of their floors until the next floor is no less than the least found."""
    best: tuple[float, Knobs, Plan] | None = None
    for floor, k, plan in sorted(variants, key=lambda v: v[0]):
        if best is not None and floor >= best[0]:
            break
        need = memory.memory_bytes(plan)
        if best is None or need < best[0]:
            best = (need, k, plan)
    if best is None:
        return None
    _, k, plan = best
    return Ranked(plan, k, cost.predict(plan, hw))


def devices_of(hw: Hardware, n: int) -> Devices:
    """``n`` devices of kind ``hw`` as a plan is resolved for them: simulated CPU devices, or
    GPUs (whose platform decides the attention kernel the cost model assumes)."""
    return Devices(count=n, platform="cpu" if hw.shared else "gpu")


def every_knob(chosen: list[Ranked], hw: Hardware, budget: float, n: int) -> list[Ranked]:
    """``chosen`` (ranked layouts, each with the knobs the planner picked) with every other
    knob combination of each layout that fits ``budget`` and resolves: the first of ``chosen``
    stays first, the rest ranked by predicted step time."""
    devices = devices_of(hw, n)
    out = []
    for r in chosen:
        base = r.plan
        par = base.config.parallel
        for k in space.knobs(par, base.config.batch_size, base.batch_shards * base.microbatches):
            if k == r.knobs:
                continue
            try:
                plan = resolve(k.apply(base.config), devices)
            except ConfigError:
                continue
            pred = cost.predict(plan, hw)
            if pred.memory_bytes <= budget:
                out.append(Ranked(plan, k, pred))
    return [chosen[0], *sorted([*chosen[1:], *out], key=lambda r: r.prediction.step_s)]


def other_remat(first: Ranked, hw: Hardware, budget: float, n: int) -> Ranked | None:
    """The best-predicted knob combination of ``first``'s layout under a remat policy other
    than ``first``'s that fits ``budget`` and resolves (None when there is none): the knob on
    which the CPU's measured step and the model disagree most (docs/planner.md, "Limits":
    every remat policy of the leading layouts measured faster than ``none``, priced dearer),
    so :func:`colossal_jax.auto.timed.time_best` times it beside the leading plans."""
    others = every_knob([first], hw, budget, n)[1:]
    return next((r for r in others if r.knobs.remat != first.knobs.remat), None)


def search(
    cfg: TrainConfig,
    n: int,
    hw: Hardware,
    budget: float,
    *,
    time_budget: float | None = None,
) -> SearchResult:
    """Every layout of ``cfg``'s model, batch and sequence on ``n`` devices of kind ``hw``, its
    knobs chosen under ``budget`` bytes per device, ranked fastest first (this module's
    docstring). ``cfg.parallel`` and the memory knobs of ``cfg`` are ignored."""
    start = time.perf_counter()
    devices = devices_of(hw, n)
    out = SearchResult()
    unfit: list[Variant] = []
    with per_token_memo.per_token_kept():
        _search_layouts(cfg, n, hw, budget, time_budget, start, devices, out, unfit)
        if not out.ranked:
            out.smallest = lightest(unfit, hw)
    out.ranked.sort(key=lambda r: r.prediction.step_s)
    out.seconds = time.perf_counter() - start
    return out


def _search_layouts(
    cfg: TrainConfig,
    n: int,
    hw: Hardware,
    budget: float,
    time_budget: float | None,
    start: float,
    devices: Devices,
    out: SearchResult,
    unfit: list[Variant],
) -> None:
    """:func:`search`'s loop over the layouts: fills ``out`` (and ``unfit``, while nothing
    fits)."""
    light = Knobs(zero=0, remat="none", offload="none", grad_accum=1)
    for par in space.layouts(n, cfg.batch_size, hw.node):
        over = time_budget is not None and time.perf_counter() - start > time_budget
        if over and out.ranked:  # stop with the best so far, once there is one
            out.stopped_early = True
            break
        out.layouts += 1
        try:
            base = resolve(light.apply(dataclasses.replace(cfg, parallel=par)), devices)
        except ConfigError as e:
            why = _reason(e)
            out.rejected[why] = out.rejected.get(why, 0) + 1
            continue
        chosen, variants = best_knobs(base, hw, budget, devices)
        if chosen is None:
            out.over_budget += 1
        else:
            out.ranked.append(chosen)
            unfit.clear()
        if not out.ranked:  # kept only while nothing fits: the impossible request's answer
            unfit.extend(variants)


def impossible(cfg: TrainConfig, n: int, hw: Hardware, budget: float, result: SearchResult) -> str:
    """The one line of a request no plan fits: the smallest memory per device that would fit,
    and the plan that would."""
    what = f"--model {cfg.model} (batch {cfg.batch_size} × seq {cfg.seq_len}) on {n} {hw.name}"
    if result.smallest is None:
        reasons = "; ".join(_one_per_subject(list(result.rejected))) or "no layout"
        return f"no valid plan for {what}: the rules refuse every layout ({reasons})"
    need = result.smallest.prediction.memory_bytes
    return (
        f"no plan for {what} fits {budget / GB:.2f} GB per device; the smallest needs "
        f"{need / GB:.2f} GB per device ({result.smallest.name}): use --memory-gb "
        f"{_round_up(need / GB)} or more devices"
    )


def _round_up(gb: float) -> str:
    """``gb`` rounded up to two significant figures, as a flag value."""
    if gb <= 0:
        return "0.01"
    digits = max(0, 1 - int(f"{gb:e}".split("e")[1]))
    step = 10 ** (-digits)
    value = (int(gb / step) + 1) * step
    return f"{value:.{digits}f}"


def why_lost(winner: Ranked, loser: Ranked) -> str:
    """Why ``loser`` is slower than ``winner``: the part of the step that grew most."""
    a, b = winner.prediction, loser.prediction
    parts = {
        "compute (recompute, redundant work)": (b.compute_s - a.compute_s),
        "pipeline bubble": b.bubble_s - a.bubble_s,
        "host offload copies": b.offload_s - a.offload_s,
        "the shared CPU's own costs (attention scores, pipeline ticks, kept activations, grid "
        "matmuls)": b.cpu_s - a.cpu_s,
    }
    for axis in set(a.axis_s) | set(b.axis_s):
        parts[f"{axis} traffic"] = b.axis_s.get(axis, 0.0) - a.axis_s.get(axis, 0.0)
    what, grew = max(parts.items(), key=lambda kv: kv[1])
    gap = b.step_s - a.step_s
    return f"+{gap * 1e3:.1f} ms per step, most from {what} (+{grew * 1e3:.1f} ms)"


def plan_for(
    cfg: TrainConfig,
    n: int,
    hw: Hardware,
    budget: float,
    *,
    time_budget: float | None = None,
) -> tuple[Plan, SearchResult]:
    """The best plan for ``cfg`` on ``n`` devices of kind ``hw`` under ``budget`` bytes per
    device; :class:`ConfigError` (:func:`impossible`'s line) when none fits."""
    result = search(cfg, n, hw, budget, time_budget=time_budget)
    if not result.ranked:
        raise ConfigError(impossible(cfg, n, hw, budget, result))
    return result.best.plan, result
