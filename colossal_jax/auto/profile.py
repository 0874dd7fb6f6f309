"""Where a plan's step time goes: XLA's own trace of a few steps, summed by kind of operation.

Method: the plan's train step is compiled, its state initialised and one step run
(:class:`~colossal_jax.auto.measure.Stepper`), then ``steps`` more run under
``jax.profiler.trace``; the trace (``jax.profiler.ProfileData``) holds one event per executed
HLO instruction, named after it, on the thread that ran it. Each event is put in a kind by its
name (:func:`kind_of`): the matmuls (``dot``, and the CPU's ``ynn``/``xnn``/``onednn``
fusions), the collectives, the slot and stack reads (``dynamic-slice``) and writes
(``dynamic-update-slice``), ``broadcast`` (zero fills), ``copy`` and transposes, and the other
fusions. The runtime's own events (its executor, rendezvous waits, the ``while`` and
``conditional`` thunks that enclose their bodies, Python frames) are left out, so nothing is
counted twice.

The seconds are **thread seconds per step, summed over the devices' threads**. On simulated
CPU devices the 8 device threads share the host's cores, so the sum exceeds the wall time by
about the threads' oversubscription, and a collective's time includes its wait for the slowest
device: compare kinds and plans with each other, not with the step's wall time.
(docs/planner.md, "Measured: where a CPU step's time goes".)

Cost: one compile, ``steps + 1`` steps and the trace (a few MB per step on 8 CPU devices).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import jax

from colossal_jax.auto.measure import Stepper
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.plan import Plan

KINDS = (
    "matmul",
    "collective",
    "dynamic-slice",
    "dynamic-update-slice",
    "broadcast",
    "copy",
    "other",
)
"""The kinds :func:`kind_of` gives, in the order reports list them."""

RUNTIME = (
    "ThunkExecutor",
    "Rendezvous",
    "Wait",
    "PjitFunction",
    "while",
    "conditional",
    "call",
    "$",
)
"""Prefixes of the trace events that are the runtime's own, not an HLO instruction's (or that
enclose other events: a ``while`` thunk's event spans its body's)."""

_MATMUL = ("dot", "ynn", "xnn", "onednn")
"""Name prefixes of XLA:CPU's matmuls: plain ``dot`` and the YNNPACK, XNNPACK and oneDNN
fusions it lowers them to."""

_COLLECTIVE = (
    "all-reduce",
    "all-gather",
    "all_gather",
    "all-to-all",
    "reduce-scatter",
    "reduce_scatter",
    "collective-permute",
)
"""Name prefixes of the collectives (JAX's ``psum``/``ppermute`` names also count, anywhere in
the name: ``psum_invariant.162``)."""


def kind_of(name: str) -> str | None:
    """The kind of the trace event ``name`` (an HLO instruction's name), or None for the
    runtime's own events (:data:`RUNTIME`)."""
    if name.startswith(RUNTIME):
        return None
    if name.startswith(_MATMUL):
        return "matmul"
    if name.startswith(_COLLECTIVE) or "psum" in name or "ppermute" in name:
        return "collective"
    if "dynamic-update-slice" in name:
        return "dynamic-update-slice"
    if "dynamic-slice" in name:
        return "dynamic-slice"
    if "broadcast" in name:
        return "broadcast"
    if "copy" in name or "transpose" in name:
        return "copy"
    return "other"


@dataclass(frozen=True)
class Breakdown:
    """A traced step: its wall seconds (the median of the traced steps' own clock), the thread
    seconds per step of each kind (:data:`KINDS`), and the ``top`` instructions as ``(name,
    kind, thread seconds per step, runs per step)``, most first."""

    step_s: float
    by_kind: dict[str, float]
    top: list[tuple[str, str, float, float]]

    @property
    def thread_s(self) -> float:
        return sum(self.by_kind.values())


def profile_plan(plan: Plan, steps: int = 3, top: int = 20) -> Breakdown:
    """Trace ``steps`` train steps of ``plan`` on the devices this process has (this module's
    docstring). Raises :class:`ConfigError` when ``steps`` is below 1 or the plan needs more
    devices."""
    if steps < 1:
        raise ConfigError(f"--steps {steps} must be at least 1 (e.g. --steps 3)")
    stepper = Stepper(plan)
    stepper.time(1)  # the warm-up, outside the trace
    with tempfile.TemporaryDirectory(prefix="colossal_jax_trace_") as where:
        with jax.profiler.trace(where):
            step_s = stepper.time(steps)
        seconds, runs = _events(Path(where))
    by_kind = dict.fromkeys(KINDS, 0.0)
    for (_, kind), ns in seconds.items():
        by_kind[kind] += ns / 1e9 / steps
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])[:top]
    return Breakdown(
        step_s=step_s,
        by_kind=by_kind,
        top=[(n, k, ns / 1e9 / steps, runs[(n, k)] / steps) for (n, k), ns in ranked],
    )


def _events(where: Path) -> tuple[Counter, Counter]:
    """``(nanoseconds, runs)`` of every HLO instruction's events in the trace under ``where``,
    keyed by ``(name, kind)``."""
    files = sorted(where.rglob("*.xplane.pb"))
    if not files:
        raise ConfigError(f"the profiler wrote no trace under {where} (is another trace running?)")
    seconds: Counter = Counter()
    runs: Counter = Counter()
    for path in files:
        data = jax.profiler.ProfileData.from_file(str(path))
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    kind = kind_of(event.name)
                    if kind is None:
                        continue
                    seconds[(event.name, kind)] += event.duration_ns
                    runs[(event.name, kind)] += 1
    return seconds, runs


def report(name: str, b: Breakdown) -> str:
    """``b`` as lines: the plan, its step, the thread seconds by kind and the top
    instructions."""
    total = b.thread_s or 1.0
    lines = [f"{name}: {b.step_s:.3f} s a step (wall), {b.thread_s:.2f} thread-s a step traced"]
    for kind in KINDS:
        s = b.by_kind[kind]
        lines.append(f"  {kind:<22} {s:8.3f} thread-s  {100 * s / total:5.1f}%")
    if b.top:
        lines.append("  top instructions (thread-s a step, runs a step):")
        lines += [f"    {s:8.3f}  {n:6.1f}  {kind:<20} {name}" for name, kind, s, n in b.top]
    return "\n".join(lines)
