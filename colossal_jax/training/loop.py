"""The training loop: the compiled step from the start step to the last, and hooks around it.

The loop dispatches steps, builds batches, reads each step's metrics and measures time;
everything else (metrics files, the progress bar, evaluation, checkpoints, the divergence
guard, the stop on a signal, the peer watchdog, the profiler) is a :class:`Hook` in its own
module under :mod:`colossal_jax.training.hooks`, called on the loop's events:

- ``start``: once, before the first step; ``before_step``: before a step is dispatched;
- ``result``: a step's metrics were read (its record);
- ``state``: the state of the step just read is in hand (on a step some hook ``wants_state``
  of, the last step and a stop): evaluation and saves;
- ``after_step``: at the end of an iteration that did not stop the loop;
- ``close``: after the loop, also when it raised, in reverse order; ``end``: after ``close``,
  when the loop finished.

Overlapped (``host_overlap``; auto: not on a CPU): step k+1 is dispatched (its batch built while
step k ran) before step k's metrics are read, so the device never waits on the host. Otherwise,
and at a step whose state a hook wants (its parameters are donated to the next step), the step
is read at once and the next batch built after. A state is saved only after its loss and
gradient norm were checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax

from colossal_jax.training.batches import global_batch
from colossal_jax.training.records import Rates
from colossal_jax.training.run import Run
from colossal_jax.training.steps import make_train_step


def compile_step(run: Run, params: Any, opt_state: Any, step: int) -> tuple[Callable, float]:
    """The train step compiled for the state and the batch of ``step``, and the seconds it
    took."""
    step_fn = make_train_step(run)
    t0 = time.perf_counter()
    compiled = step_fn.lower(params, opt_state, global_batch(run, step)).compile()
    return compiled, time.perf_counter() - t0


@dataclass
class LoopClock:
    """What the loop measures. ``mark``: where the next step's time starts (the last results
    read, or a pause's end), so the steps' times tile the loop, host work included; ``paused``:
    seconds spent in evaluation and checkpoint saves; ``in_step``: seconds inside the compiled
    step's call or waiting for its results. After :meth:`stop`: ``loop_s`` (the loop without its
    pauses) and ``host_s`` (the part of it neither in a step's call nor waiting for results)."""

    mark: float = 0.0
    paused: float = 0.0
    in_step: float = 0.0
    started: float = 0.0
    loop_s: float = 0.0
    host_s: float = 0.0

    def start(self) -> None:
        self.started = self.mark = time.perf_counter()

    def stop(self) -> None:
        self.loop_s = time.perf_counter() - self.started - self.paused
        self.host_s = self.loop_s - self.in_step

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Time that belongs to no step (an evaluation, a save); the next step's time starts
        after it."""
        t_pause = time.perf_counter()
        yield
        self.paused += time.perf_counter() - t_pause
        self.mark = time.perf_counter()

    def call(self, step: Callable, *args: Any) -> Any:
        """``step(*args)``, its call timed as in a step."""
        t_call = time.perf_counter()
        out = step(*args)
        self.in_step += time.perf_counter() - t_call
        return out

    def read(self, outputs: Any) -> tuple[Any, float]:
        """``(outputs on the host, the step's seconds)``: the wait is in a step; the step's time
        runs from the previous mark to now."""
        t_wait = time.perf_counter()
        host = jax.device_get(outputs)
        now = time.perf_counter()
        self.in_step += now - t_wait
        seconds, self.mark = now - self.mark, now
        return host, seconds


class Hook:
    """One concern of the loop. Every event is a no-op here; a hook overrides those it handles
    (see :mod:`colossal_jax.training.loop` for when each is called)."""

    def start(self, loop: Loop) -> None:
        """Once, before the first step is dispatched."""

    def before_step(self, loop: Loop, number: int) -> None:
        """Step ``number`` is about to be dispatched."""

    def wants_state(self, loop: Loop, step: int) -> bool:
        """Whether the state of ``step`` (just dispatched) must be kept for :meth:`state`."""
        return False

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Step ``record["step"]`` was read: its ``record`` (which later hooks see, and may
        extend) and its ``outputs`` on the host."""

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        """The state of step ``loop.step`` (``record`` is its record) is in ``loop.params`` and
        ``loop.opt_state``."""

    def after_step(self, loop: Loop) -> None:
        """An iteration of the loop ended without stopping it."""

    def close(self, loop: Loop) -> None:
        """After the loop, also when it raised (the hooks in reverse order)."""

    def end(self, loop: Loop) -> None:
        """After :meth:`close`, when the loop finished without raising."""


class Hooks:
    """The hooks of a loop, called in the order they were added (``close`` in reverse)."""

    def __init__(self, hooks: list[Hook] | None = None):
        self.hooks: list[Hook] = list(hooks or [])

    def add(self, hook: Hook) -> None:
        self.hooks.append(hook)

    def start(self, loop: Loop) -> None:
        for hook in self.hooks:
            hook.start(loop)

    def before_step(self, loop: Loop, number: int) -> None:
        for hook in self.hooks:
            hook.before_step(loop, number)

    def wants_state(self, loop: Loop, step: int) -> bool:
        return any(hook.wants_state(loop, step) for hook in self.hooks)

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook.result(loop, record, outputs)

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook.state(loop, record)

    def after_step(self, loop: Loop) -> None:
        for hook in self.hooks:
            hook.after_step(loop)

    def close(self, loop: Loop) -> None:
        for hook in reversed(self.hooks):
            hook.close(loop)

    def end(self, loop: Loop) -> None:
        for hook in self.hooks:
            hook.end(loop)


@dataclass
class Loop:
    """The loop's state, which its hooks read. ``params``/``opt_state``: the state after the
    last step dispatched (donated to the next); ``step``: the last step dispatched (from
    ``start_step`` to ``last_step``); ``stop``: nonzero once a hook asks the loop to stop (the
    signal number the processes agreed on): the loop reads the step at once, calls ``state``
    (which saves it) and ends; ``losses``/``step_times``: of every step read; ``overlap``: see
    the module's docstring."""

    run: Run
    compiled: Callable
    params: Any
    opt_state: Any
    step: int
    rates: Rates
    overlap: bool
    start_step: int = field(init=False)
    stop: int = 0
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    clock: LoopClock = field(default_factory=LoopClock)

    def __post_init__(self) -> None:
        self.start_step = self.step

    @property
    def last_step(self) -> int:
        return self.run.cfg.steps

    def run_steps(self, hooks: Hooks) -> None:
        """Run the steps to ``last_step`` (or a stop), calling ``hooks`` on the loop's events."""
        pending: tuple[int, Any] | None = None
        try:
            hooks.start(self)
            batch = global_batch(self.run, self.step)
            self.clock.start()
            while self.step < self.last_step:
                hooks.before_step(self, self.step + 1)
                self.params, self.opt_state, out = self.clock.call(
                    self.compiled, self.params, self.opt_state, batch
                )
                self.step += 1
                read_now = (
                    not self.overlap
                    or self.step == self.last_step
                    or hooks.wants_state(self, self.step)
                    or self.stop
                )
                if not read_now:
                    batch = global_batch(self.run, self.step)  # while the device runs the step
                if pending is not None:
                    hooks.result(self, *self._read(*pending))
                pending = (self.step, out)
                if read_now or self.stop:  # reading the step before may have set the stop
                    record, outputs = self._read(*pending)
                    pending = None
                    hooks.result(self, record, outputs)
                    hooks.state(self, record)
                    if self.stop:
                        break
                    if self.step < self.last_step:
                        batch = global_batch(self.run, self.step)
                hooks.after_step(self)
            self.clock.stop()
        finally:
            hooks.close(self)
        hooks.end(self)

    def _read(self, at: int, outputs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Wait for step ``at``'s ``outputs``: ``(its record, the outputs on the host)``."""
        host, seconds = self.clock.read(outputs)
        record = self.rates.record(at, host, seconds)
        self.losses.append(record["loss"])
        self.step_times.append(seconds)
        return record, host
