"""SIGINT/SIGTERM as a stop every process agrees on. Each training batch carries this process's
stop flag (:func:`colossal_jax.training.batches.stop_flags`) and each step returns the largest
of any process; once one is read the loop saves the step it reached and stops, and
:func:`stop_if_signalled` raises :class:`colossal_jax.runtime.signals.Interrupted` with the line
that says where the checkpoint is. Before the loop, a signal is looked at after each stage of
setting the run up."""

from __future__ import annotations

import signal
from typing import Any

from colossal_jax.runtime import signals
from colossal_jax.training.checkpoint import Checkpointer
from colossal_jax.training.loop import Hook, Loop


class StopOnSignal(Hook):
    """Agrees on the stop flag, sets ``loop.stop`` and raises at the start and the end."""

    def __init__(self, ckpt: Checkpointer | None):
        self.ckpt = ckpt

    def start(self, loop: Loop) -> None:
        stop_if_signalled(self.ckpt, loop.start_step, started=False)

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        loop.stop = max(loop.stop, int(outputs["stop"]))

    def end(self, loop: Loop) -> None:
        started = loop.step > loop.start_step
        stop_if_signalled(self.ckpt, loop.step, started=started, agreed=loop.stop)


def stop_if_signalled(
    ckpt: Checkpointer | None, step: int, *, started: bool, agreed: int = 0
) -> None:
    """If SIGINT/SIGTERM arrived (:mod:`colossal_jax.runtime.signals`), or ``agreed`` (the stop
    flag the steps agreed on) says that another process received one: wait for the checkpoint
    of ``step`` (the loop saved it) and raise :class:`signals.Interrupted` with the line that
    says where it is."""
    own = signals.received()
    signum = own if own is not None else (agreed or None)
    if signum is None:
        return
    head = "interrupted" if signum == signal.SIGINT else f"interrupted by {signals.name(signum)}"
    if own is None:
        head += " (received by another process)"
    latest = ckpt.wait() if ckpt is not None else None
    if not started and step == 0 and latest is None:
        line = f"{head} before the first step; nothing to save"
    elif ckpt is None:
        line = f"{head} at step {step}; nothing saved (no --checkpoint-dir)"
    elif latest == step:
        line = (
            f"{head} at step {step}; checkpoint saved in {ckpt.directory} (re-run the same "
            "command to resume)"
        )
    else:
        line = (
            f"{head} at step {step}; the latest checkpoint is step {latest} in {ckpt.directory} "
            "(re-run the same command to resume)"
        )
    raise signals.Interrupted(signum, line)
