"""The figures of one plan's compiled train step, and its measured step time, on the devices
this process has.

:func:`compile_plan` builds the run of a :class:`Plan` (:func:`colossal_jax.training.run.build`)
and lowers and compiles its train step for abstract state in the run's shardings — nothing is
allocated or executed — then reads, per device:

- ``flops``: the FLOPs of every ``dot`` (:func:`colossal_jax.analysis.compute.matmul_flops`: loop
  bodies times their trip count, which XLA's ``cost_analysis`` counts once; the scanned layer
  stack is such a loop). A pipelined step counts each stage's branches of the tick switch as
  often as its tick table runs them, and reports the busiest stage.
- ``bytes_accessed``: XLA's ``cost_analysis()["bytes accessed"]`` (loop bodies once).
- ``argument_bytes``, ``output_bytes``, ``temp_bytes``: ``memory_analysis()``; ``peak_bytes``
  is ``argument + output − alias + temp``, what the step holds at once.
- ``axis_bytes``: bytes each device receives per step by mesh axis, from the program's
  collectives attributed by their device groups (:mod:`colossal_jax.analysis.axes`).
- ``compile_s``: seconds to lower and compile.

:func:`run_plan` initialises the state, compiles, runs one warm-up step and returns the median
of ``steps`` timed steps (each blocked on), on one batch built beforehand;
:func:`measure_plan` does both with one compile. The ``*_cached`` forms keep their results in
the planner's disk cache (:mod:`colossal_jax.auto.cache`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import jax

from colossal_jax.analysis.axes import axis_bytes
from colossal_jax.analysis.compile_only import ANALYSIS_ONLY
from colossal_jax.analysis.compute import matmul_flops
from colossal_jax.auto.cache import Cache, plan_key
from colossal_jax.config.choices import MESH_ORDER
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.plan import Plan, devices_hint
from colossal_jax.training.batches import global_batch
from colossal_jax.training.checkpoint import abstract_like
from colossal_jax.training.run import Run, build, init_state
from colossal_jax.training.stack_order import to_stored
from colossal_jax.training.steps import make_train_step


@dataclass(frozen=True)
class Compiled:
    """The figures of one compiled train step, per device (see the module docstring)."""

    flops: float
    bytes_accessed: float
    argument_bytes: float
    output_bytes: float
    temp_bytes: float
    peak_bytes: float
    axis_bytes: dict[str, float]
    compile_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Compiled:
        return cls(**{**record, "axis_bytes": dict(record["axis_bytes"])})


def compile_plan(plan: Plan) -> Compiled:
    """Lower and compile ``plan``'s train step on the devices this process has (nothing runs)
    and read its figures. Raises :class:`ConfigError` when the plan needs more devices."""
    return measure_plan(plan, 0)[0]


def run_plan(plan: Plan, steps: int) -> float:
    """The median seconds of ``steps`` train steps of ``plan`` after one warm-up step, each
    blocked on, on the devices this process has (one batch, built before the clock starts)."""
    if steps < 1:
        raise ConfigError(f"steps={steps} must be at least 1 to measure a step time")
    seconds = measure_plan(plan, steps)[1]
    assert seconds is not None
    return seconds


def measure_plan(plan: Plan, steps: int) -> tuple[Compiled, float | None]:
    """``(figures, median step seconds or None)``: ``plan``'s train step compiled once — for
    abstract state when ``steps`` is 0 (nothing allocated), else for its initialised state,
    then one warm-up step and ``steps`` timed ones."""
    stepper = Stepper(plan, allocate=steps > 0)
    if steps == 0:
        return stepper.figures, None
    stepper.time(1)  # the warm-up
    return stepper.figures, stepper.time(steps)


class Stepper:
    """``plan``'s train step compiled on the devices this process has, with its figures and
    (``allocate``) its initialised state and one batch, to time steps on demand."""

    def __init__(self, plan: Plan, allocate: bool = True):
        _check_devices(plan)
        run = build(plan)
        if allocate:
            params, opt_state = to_stored(run, *init_state(run))
        else:
            params = abstract_like(run.abstract_params, run.param_shardings)
            abstract_opt = jax.eval_shape(run.tx.init, run.abstract_params)
            opt_state = abstract_like(abstract_opt, run.opt_shardings)
        self.state, self.batch = (params, opt_state), global_batch(run, 0)
        t0 = time.perf_counter()
        lowered = make_train_step(run).lower(params, opt_state, self.batch)
        # a step that only gives its figures compiles without LLVM's optimisations
        self.step = lowered.compile(compiler_options=None if allocate else ANALYSIS_ONLY)
        self.figures = figures(run, self.step, time.perf_counter() - t0)

    def time(self, steps: int) -> float:
        """The median seconds of ``steps`` steps, each blocked on."""
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            params, opt_state, out = self.step(*self.state, self.batch)
            jax.block_until_ready((params, opt_state, out))
            times.append(time.perf_counter() - t0)
            self.state = (params, opt_state)
        return statistics.median(times)


def figures(run: Run, compiled: Any, compile_s: float) -> Compiled:
    """The :class:`Compiled` figures of ``run``'s compiled train step."""
    text = compiled.as_text()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    mem = compiled.memory_analysis()
    argument, output = float(mem.argument_size_in_bytes), float(mem.output_size_in_bytes)
    temp, alias = float(mem.temp_size_in_bytes), float(mem.alias_size_in_bytes)
    return Compiled(
        flops=_flops(run, text),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        argument_bytes=argument,
        output_bytes=output,
        temp_bytes=temp,
        peak_bytes=argument + output - alias + temp,
        axis_bytes=_axis_bytes(run, text),
        compile_s=compile_s,
    )


def _flops(run: Run, text: str) -> float:
    """Matmul FLOPs per device; for a pipeline, those of its busiest stage."""
    if run.schedule is None:
        return matmul_flops(text)
    return max(matmul_flops(text, counts) for counts in _stage_branch_counts(run))


def _axis_bytes(run: Run, text: str) -> dict[str, float]:
    """Bytes per device by mesh axis; for a pipeline, its busiest stage's (each branch of the
    tick switch and of the message switch counted on the ticks the table runs it)."""
    shape, names = tuple(run.plan.mesh_shape), tuple(MESH_ORDER)
    if run.schedule is None:
        return axis_bytes(text, shape, names)
    per_stage = [axis_bytes(text, shape, names, c) for c in _stage_branch_counts(run)]
    return max(per_stage, key=lambda b: sum(b.values()))


def _stage_branch_counts(run: Run) -> list[dict[int, list[int]]]:
    """For each stage, how often each branch of the tick switch and of the message switch
    runs (:func:`colossal_jax.analysis.compute.matmul_flops`'s ``branch_counts``)."""
    sched = run.schedule
    assert sched is not None
    rings = sched.ring_counts()
    return [
        {len(sched.branches): sched.branch_counts(s), len(rings): rings}
        for s in range(sched.stages)
    ]


def _check_devices(plan: Plan) -> None:
    have = jax.device_count()
    if plan.n_devices > have:
        raise ConfigError(
            f"the plan {plan.config.parallel.short()} needs {plan.n_devices} devices but this "
            f"process has {have}; {devices_hint(plan.n_devices, have)}"
        )


def compile_cached(plan: Plan, cache: Cache | None = None) -> tuple[Compiled, bool]:
    """``(figures, hit)``: :func:`compile_plan`'s figures for ``plan``, read from ``cache``
    (default: ``Cache("compiled")`` under :func:`~colossal_jax.auto.cache.default_dir`) when a
    result for the same plan, JAX, devices and source is there, else compiled and stored."""
    cache = cache if cache is not None else Cache("compiled")
    key, parts = plan_key(plan, "compiled")
    hit = cache.get(key)
    if hit is not None:
        return Compiled.from_json(hit), True
    figures_ = compile_plan(plan)
    cache.put(key, figures_.to_json(), about=parts)
    return figures_, False


def measure_cached(
    plan: Plan, steps: int, cache: Cache | None = None
) -> tuple[Compiled, float | None, bool]:
    """``(figures, median step seconds or None, hit)``: :func:`measure_plan`'s result, from
    ``cache`` (default ``Cache("measured")``) when measured before with the same ``steps``,
    else measured and stored."""
    cache = cache if cache is not None else Cache("measured")
    key, parts = plan_key(plan, "measured", steps)
    hit = cache.get(key)
    if hit is not None:
        return Compiled.from_json(hit["compiled"]), hit["step_s"], True
    compiled, seconds = measure_plan(plan, steps)
    cache.put(key, {"compiled": compiled.to_json(), "step_s": seconds}, about=parts)
    return compiled, seconds, False
