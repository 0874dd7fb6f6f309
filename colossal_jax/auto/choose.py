"""The planner for a run about to start: ``scripts/train.py --mesh auto`` and
:func:`auto_plan` (``cj.train(cj.auto_plan(cfg))``), and the preset ``scripts/plan.py --out``
writes.

The devices a run has decide the hardware model: simulated CPU devices are costed with this
machine's calibration (:func:`colossal_jax.auto.hardware.load_cpu`), a GPU as an H100 (the
backend does not say which GPU it is; ``scripts/plan.py --device`` chooses explicitly). The
memory budget is the device's memory where JAX reports it, else the model's (on a CPU, the host's
memory shared by the simulated devices).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from colossal_jax.auto import hardware
from colossal_jax.auto.hardware import Hardware
from colossal_jax.auto.search import (
    Ranked,
    SearchResult,
    every_knob,
    other_remat,
    plan_for,
    why_lost,
)
from colossal_jax.auto.timed import Timed, time_best
from colossal_jax.checks.resolve import bind
from colossal_jax.config.plan import Devices, Plan
from colossal_jax.config.schema import TrainConfig

AUTO = "auto"
"""``--mesh auto``."""

DEFAULT_TIME_BUDGET = 30.0
"""Seconds ``--mesh auto`` searches before it takes the best plan found."""

VERIFY_COMPILES = 4
"""Plans ``--mesh auto`` compiles, best first, until one's compiled peak fits the budget: the
cost model's memory is an estimate (docs/planner.md), a compile on the run's own devices is
the backend's word (on one H100 the predicted choice for gpt3-xl ran out of memory,
docs/gpu/call4_log.txt)."""


def hardware_of(devices: Devices) -> Hardware:
    """The hardware model of ``devices`` (this module's docstring)."""
    hw = hardware.hardware("cpu" if devices.platform == "cpu" else "h100")
    if devices.memory_bytes is not None:
        hw = dataclasses.replace(hw, memory_bytes=float(devices.memory_bytes))
    return hw


def budget_of(hw: Hardware, n: int) -> float:
    """Bytes per device the plans must fit: :data:`~colossal_jax.auto.hardware.USABLE_MEMORY`
    of a GPU's memory, or on a CPU the host's shared by its ``n`` simulated devices."""
    return hw.memory_bytes / n if hw.shared else hw.memory_bytes * hardware.USABLE_MEMORY


def summary(result: SearchResult, hw: Hardware, timed: Sequence[Timed] = ()) -> list[str]:
    """Lines saying the chosen plan, its prediction and why the runner-up lost (with ``timed``,
    :func:`colossal_jax.auto.timed.time_best`'s candidates: by how much it measured slower)."""
    best = result.best
    p = best.prediction
    seconds = {id(t.ranked): t.seconds for t in timed if t.seconds is not None}
    measured = f", measured {seconds[id(best)] * 1e3:.1f} ms" if id(best) in seconds else ""
    lines = [
        f"planned: {best.name}: predicted {p.step_s * 1e3:.1f} ms per step{measured}, "
        f"{p.memory_bytes / 1e9:.2f} GB per device ({hw.name}); {len(result.ranked)} plans "
        f"fit of {result.layouts} layouts searched in {result.seconds:.1f} s"
    ]
    if len(result.ranked) > 1:
        second = result.ranked[1]
        if id(best) in seconds and id(second) in seconds:
            gap = seconds[id(second)] - seconds[id(best)]
            why = f"+{gap * 1e3:.1f} ms per step measured"
        else:
            why = why_lost(best, second)
        lines.append(f"runner-up: {second.name}: {why}")
    if result.stopped_early:
        lines.append("the time budget ended the search early: this is the best found so far")
    return lines


def auto_plan(
    cfg: TrainConfig,
    devices: Devices | None = None,
    *,
    time_budget: float | None = DEFAULT_TIME_BUDGET,
    log: Callable[[str], None] | None = print,
    measure: int = 0,
) -> Plan:
    """The plan the planner chooses for ``cfg`` (its model, batch, sequence and training fields;
    its mesh, modes and memory knobs are replaced) on ``devices`` (default: the devices JAX
    has), bound to them; the chosen plan and why are passed to ``log``. ``measure``: time that
    many best-predicted plans, and with 2 or more the first's layout under another remat policy
    (:func:`colossal_jax.auto.search.other_remat`), on ``devices`` and take the fastest measured
    (:func:`colossal_jax.auto.timed.time_best`), within what is left of ``time_budget``. Raises
    :class:`~colossal_jax.config.errors.ConfigError` when no plan fits."""
    if devices is None:
        from colossal_jax.runtime.devices import current_devices

        devices = current_devices()
    n = cfg.devices or devices.count
    hw = hardware_of(devices)
    budget = budget_of(hw, n)
    start = time.perf_counter()
    _, result = plan_for(cfg, n, hw, budget, time_budget=time_budget)
    checks = verify_on(result, devices, budget, hw)
    timed: list[Timed] = []
    if measure:  # the timing gets what the search and the compile check left of the budget
        left = None if time_budget is None else time_budget - (time.perf_counter() - start)
        alt = other_remat(result.best, hw, budget, n)
        timed, lines = time_best(
            result, measure, budget, devices=devices, time_budget=left, alternative=alt
        )
        checks += lines
    if log is not None:
        for line in summary(result, hw, timed) + checks:
            log(line)
    return bind(result.best.plan, devices)


def verify_on(
    result: SearchResult,
    devices: Devices,
    budget: float,
    hw: Hardware | None = None,
    limit: int = VERIFY_COMPILES,
) -> list[str]:
    """Compile the ranked plans on ``devices`` (the run's own; abstract state, nothing
    allocated), best first, until one's compiled peak fits ``budget``, and make it the best
    (:attr:`SearchResult.best`). Once the planner's pick for the best layout compiles over,
    the layouts' other knob choices (remat, offload, accumulation; :func:`every_knob`) join the
    candidates in predicted order, so one device, where the layout is fixed, still finds the
    plan that fits. Returns a line for each plan dropped. Raises
    :class:`~colossal_jax.config.errors.ConfigError` when ``limit`` compiles find none."""
    from colossal_jax.auto.measure import compile_cached
    from colossal_jax.config.errors import ConfigError

    lines: list[str] = []
    candidates = list(result.ranked)
    for i in range(limit):
        if i >= len(candidates):
            break
        ranked = candidates[i]
        peak = compile_cached(bind(ranked.plan, devices))[0].peak_bytes
        if peak <= budget:
            result.ranked[:] = [ranked, *(r for r in candidates[i + 1 :])]
            return lines
        lines.append(
            f"compiled {ranked.name}: {peak / 1e9:.2f} GB per device, over the budget "
            f"{budget / 1e9:.2f} GB (predicted {ranked.prediction.memory_bytes / 1e9:.2f}); "
            "taking the next plan"
        )
        if i == 0 and hw is not None:
            candidates = every_knob(candidates, hw, budget, ranked.plan.n_devices)
    raise ConfigError(
        f"the planner's best {min(limit, len(candidates))} plans all compile over "
        f"{budget / 1e9:.2f} GB per device; use more devices, a smaller --batch-size, or "
        "--mesh with --remat full"
    )


def preset_text(best: Ranked, header: str) -> str:
    """A ``meshes/`` TOML preset of ``best`` that ``scripts/train.py --mesh FILE`` runs: the
    axes (``data`` too, so the preset fixes the device count), the modes and the memory knobs
    (``[train]``, :data:`colossal_jax.config.mesh_spec.PRESET_TRAIN`); ``header`` becomes its
    comment lines."""
    par = best.plan.config.parallel
    cfg = best.plan.config
    lines = [f"# {line}" for line in header.splitlines()]
    lines.append("[mesh]")
    for axis, size in par.axis_sizes.items():
        if size > 1 or axis == "data":
            lines.append(f"{axis} = {size}")
    lines.append("[modes]")
    lines.append(f'tensor_mode = "{par.tensor_mode}"')
    lines.append(f'seq_mode = "{par.seq_mode}"')
    lines.append(f"zero = {par.zero}")
    if par.pipelined:
        lines.append(f'pipeline = "{par.pipeline}"')
        lines.append(f"microbatches = {par.num_microbatches}")
        if par.virtual_stages > 1:
            lines.append(f"virtual_stages = {par.virtual_stages}")
    lines.append("[train]")
    lines.append(f'remat = "{cfg.remat}"')
    lines.append(f'offload = "{cfg.offload}"')
    lines.append(f"grad_accum = {cfg.grad_accum}")
    if cfg.precision != "fp32":
        lines.append(f'precision = "{cfg.precision}"')
    return "\n".join(lines) + "\n"
