"""``--profile-dir``/``--profile-steps``: the step profiler
(:mod:`colossal_jax.runtime.profiling`) told of each step before it is dispatched, and closed
with the loop."""

from __future__ import annotations

from colossal_jax.runtime.profiling import StepProfiler
from colossal_jax.training.loop import Hook, Loop


class Profiler(Hook):
    """Traces the steps ``profiler`` was asked for; waits on the state before a trace stops."""

    def __init__(self, profiler: StepProfiler):
        self.profiler = profiler

    def before_step(self, loop: Loop, number: int) -> None:
        self.profiler.step(number, pending=loop.params)

    def close(self, loop: Loop) -> None:
        self.profiler.close(pending=loop.params)
