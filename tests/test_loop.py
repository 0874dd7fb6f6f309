"""The training loop calls its hooks in a fixed order (colossal_jax/training/loop.py).

A fake step (host arrays, no compile) and a hook that writes down every event show the order of
batch builds, reads and events with and without ``host_overlap``, that a hook's wish for a
step's state makes the loop read that step at once, that a stop ends the loop after the
stopping step's state, and that ``close`` runs in reverse order, also when a hook raised.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import colossal_jax.training.loop as L
from colossal_jax.training.loop import Hook, Hooks, Loop
from colossal_jax.training.records import RATE_WINDOW, Rates


class Recorder(Hook):
    """Writes each event into ``events``; wants the state of the steps in ``keep``."""

    def __init__(self, events: list[str], keep: tuple[int, ...] = (), name: str = ""):
        self.events, self.keep, self.name = events, keep, name

    def start(self, loop):
        self.events.append("start")

    def before_step(self, loop, number):
        self.events.append(f"before{number}")

    def wants_state(self, loop, step):
        return step in self.keep

    def result(self, loop, record, outputs):
        self.events.append(f"result{record['step']}")

    def state(self, loop, record):
        self.events.append(f"state{record['step']}")

    def after_step(self, loop):
        self.events.append("after")

    def close(self, loop):
        self.events.append(f"close{self.name}")

    def end(self, loop):
        self.events.append("end")


def _loop(monkeypatch, events: list[str], steps: int = 4, overlap: bool = True) -> Loop:
    def batch(run, step):
        events.append(f"b{step}")
        return step

    def step(params, opt_state, batch):
        outputs = {"loss": np.float32(batch), "grad_norm": np.float32(1.0), "stop": np.int32(0)}
        return params, opt_state, outputs

    monkeypatch.setattr(L, "global_batch", batch)
    run = SimpleNamespace(cfg=SimpleNamespace(steps=steps))
    rates = Rates(0, lambda step: 0.0, 1, 1.0, None, 1)
    return Loop(run, step, params=None, opt_state=None, step=0, rates=rates, overlap=overlap)


def test_overlapped_steps_are_read_one_late_except_where_a_hook_wants_the_state(monkeypatch):
    events: list[str] = []
    loop = _loop(monkeypatch, events)
    loop.run_steps(Hooks([Recorder(events, keep=(2,))]))
    assert events == [
        "start", "b0",
        "before1", "b1", "after",
        "before2", "result1", "result2", "state2", "b2", "after",
        "before3", "b3", "after",
        "before4", "result3", "result4", "state4", "after",
        "close", "end",
    ]  # fmt: skip
    assert loop.losses == [0.0, 1.0, 2.0, 3.0] and len(loop.step_times) == 4
    assert sum(loop.step_times) <= loop.clock.loop_s


def test_without_overlap_each_step_is_read_before_the_next_batch(monkeypatch):
    events: list[str] = []
    _loop(monkeypatch, events, steps=2, overlap=False).run_steps(Hooks([Recorder(events)]))
    assert events == [
        "start", "b0",
        "before1", "result1", "state1", "b1", "after",
        "before2", "result2", "state2", "after",
        "close", "end",
    ]  # fmt: skip


def test_a_stop_ends_the_loop_after_the_state_of_the_step_reached(monkeypatch):
    events: list[str] = []

    class StopAtOne(Hook):
        def result(self, loop, record, outputs):
            if record["step"] == 1:
                loop.stop = 15

    loop = _loop(monkeypatch, events)
    loop.run_steps(Hooks([StopAtOne(), Recorder(events)]))
    assert events == [
        "start", "b0",
        "before1", "b1", "after",
        "before2", "b2", "result1", "result2", "state2",
        "close", "end",
    ]  # fmt: skip
    assert loop.step == 2 and loop.stop == 15


def test_close_runs_in_reverse_order_also_after_a_failure_and_end_does_not(monkeypatch):
    events: list[str] = []

    class Fails(Hook):
        def result(self, loop, record, outputs):
            raise RuntimeError("diverged")

    hooks = Hooks([Recorder(events, name="A"), Fails(), Recorder(events, name="B")])
    with pytest.raises(RuntimeError, match="diverged"):
        _loop(monkeypatch, events, overlap=False).run_steps(hooks)
    assert events[-3:] == ["result1", "closeB", "closeA"]


def test_a_records_rate_averages_over_the_last_steps_so_one_short_interval_reads_true():
    # On an H200 an offloaded step's interval read 3.6 ms against ~70 ms (its neighbour held the
    # rest): a per-interval rate reported an MFU of 550%. Over the window the rate is the mean.
    rates = Rates(0, lambda step: 0.0, tokens_per_step=1000, flops_per_step=1e12, peak=1e14,
                  devices=1)  # fmt: skip
    out = {"loss": np.float32(1.0), "grad_norm": np.float32(1.0)}
    times = [0.07, 0.07, 0.1364, 0.0036]
    records = [rates.record(i + 1, out, t) for i, t in enumerate(times)]
    assert [r["step_time_s"] for r in records] == times
    assert records[0]["tokens_per_s"] == pytest.approx(1000 / 0.07)
    assert records[-1]["tokens_per_s"] == pytest.approx(4000 / sum(times))
    assert records[-1]["mfu"] == pytest.approx(4e12 / sum(times) / 1e14)
    assert all(r["mfu"] <= 1.0 for r in records) and 1e12 / 0.0036 / 1e14 > 1.0
    for i in range(2 * RATE_WINDOW):  # the window keeps the last RATE_WINDOW steps
        last = rates.record(5 + i, out, 0.5)
    assert last["tokens_per_s"] == pytest.approx(1000 / 0.5)


def test_the_first_learning_rates_are_computed_before_the_loop_times_a_step():
    """``Rates.of`` computes the first window of learning rates (a jitted call, on the host's
    CPU backend): on a GPU that call waited behind the steps in flight inside a timed step."""
    from colossal_jax.training.run import build as build_run
    from tests.helpers import tiny_config

    rates = Rates.of(build_run(tiny_config(steps=6)), start_step=2)
    assert rates.lr._first == 2 and len(rates.lr._values) == 4
    assert rates.lr(2) == pytest.approx(rates.lr._values[0])
