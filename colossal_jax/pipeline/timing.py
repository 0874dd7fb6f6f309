"""Cost-aware timing of a tick table: each operation weighed by what its branch costs.

The tick table (:mod:`colossal_jax.pipeline.schedule`) gives every operation one tick. Real
operations differ — a fused backward costs about two forwards, and with a split backward B and
W about one each — and the SPMD executor runs in **lockstep**: a tick lasts as long as its
costliest operation on any stage (a tick with a backward on one stage and a forward on another
costs a backward everywhere). Given a cost per branch (e.g. compiled matmul FLOPs per branch,
``scripts/bench_pipeline.py``) this module reports:

- ``step_time``: the schedule's time with every stage running its order as soon as its input
  is there, an operation taking its cost (what an MPMD pipeline, or a GPU per stage with
  asynchronous sends, would take); ``idle_fraction = 1 − Σ work / (p · step_time)``;
- ``lockstep_time``: ``Σ_t max_s cost(t, s)``, what the one-program executor takes;
  ``lockstep_idle_fraction`` likewise.

Message latency is taken as zero in both (a send is usable by the next operation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from colossal_jax.pipeline.schedule import COL, Op, Schedule, dependency


@dataclass(frozen=True)
class Timing:
    """A schedule's times in cost units (see the module docstring)."""

    work_per_stage: list[float]
    step_time: float
    idle_fraction: float
    lockstep_time: float
    lockstep_idle_fraction: float


def op_branches(schedule: Schedule) -> dict[tuple[int, int, int], str]:
    """The branch name each operation ``(kind, microbatch, chunk)`` runs, from the table."""
    names = schedule.branches
    out = {}
    for t, row in enumerate(schedule.timeline):
        for s, op in enumerate(row):
            if op is not None:
                out[(op.kind, op.microbatch, op.chunk)] = names[schedule.table[t, s, COL["branch"]]]
    return out


def weigh(schedule: Schedule, cost: Mapping[str, float]) -> Timing:
    """Time ``schedule`` with ``cost[branch]`` per operation (every branch it runs but idle)."""
    branch = op_branches(schedule)
    missing = sorted({b for b in branch.values() if b not in cost})
    if missing:
        raise ValueError(f"no cost for the branches {missing}; give one for each")

    def of(op: Op) -> float:
        return float(cost[branch[(op.kind, op.microbatch, op.chunk)]])

    p = schedule.stages
    work = [sum(of(op) for op in order) for order in schedule.orders]
    step = _as_soon_as_ready(schedule, of)
    lockstep = sum(
        max((of(op) for op in row if op is not None), default=0.0) for row in schedule.timeline
    )
    total = sum(work)
    return Timing(
        work_per_stage=work,
        step_time=step,
        idle_fraction=1.0 - total / (p * step) if step else 0.0,
        lockstep_time=lockstep,
        lockstep_idle_fraction=1.0 - total / (p * lockstep) if lockstep else 0.0,
    )


def _as_soon_as_ready(schedule: Schedule, of) -> float:
    """Finish time of the last operation when each stage runs its order back to back, an
    operation starting once its stage is free and its dependency has finished."""
    last = schedule.chunks - 1
    finish: dict[tuple[int, int, int], float] = {}
    free = [0.0] * schedule.stages
    pos = [0] * schedule.stages
    remaining = sum(len(o) for o in schedule.orders)
    while remaining:
        progressed = False
        for s, order in enumerate(schedule.orders):
            while pos[s] < len(order):
                op = order[pos[s]]
                dep = dependency(op, last)
                if dep is not None and dep not in finish:
                    break
                start = max(free[s], finish[dep] if dep is not None else 0.0)
                free[s] = finish[(op.kind, op.microbatch, op.chunk)] = start + of(op)
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule's orders deadlock")
    return max(free)
