"""Ctrl-C (SIGINT) and SIGTERM as a request to stop, never an exception inside XLA.

Python's default SIGINT handling raises ``KeyboardInterrupt`` wherever the main thread happens to
be: inside JAX's lowering, in the middle of a compilation's Python callbacks, or while orbax's
and JAX's threads are live, and the teardown that follows can crash the interpreter
(``Segmentation fault``). :func:`install` replaces the handlers of both signals with one that
only records the signal; the training loop (:func:`colossal_jax.training.trainer.train`) looks at
:func:`received` between steps and at the points before it (after the model is built, after the
state is restored, after compiling), writes a checkpoint at the step reached and raises
:class:`Interrupted`, which the command line turns into one line and exit status 130 (SIGINT) or
143 (SIGTERM). A second signal while it waits for that checkpoint exits at once (the checkpoint
being written is then discarded whole, see :mod:`colossal_jax.training.checkpoint`).

The handlers are installed by the command line only; a Python program using the API may call
:func:`install` itself.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
"""Exit status of a run stopped by each signal: 128 + the signal number, as a shell reports it."""

_received: int | None = None


class Interrupted(Exception):
    """The run stopped on a signal; ``line`` says at which step and where it saved."""

    def __init__(self, signum: int, line: str):
        super().__init__(line)
        self.signum = signum
        self.line = line

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def exit_code(signum: int) -> int:
    """The exit status for ``signum`` (130 for SIGINT, 143 for SIGTERM)."""
    return EXIT_CODES.get(signal.Signals(signum), 128 + int(signum))


def install() -> None:
    """Handle SIGINT and SIGTERM by recording them (main thread only; idempotent)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in EXIT_CODES:
        signal.signal(sig, _handler)


def ignore() -> None:
    """Ignore SIGINT and SIGTERM from now on (a finished process on its way out; main thread
    only). Unlike a Python handler, an ignored signal stays ignored through interpreter
    shutdown."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in EXIT_CODES:
        signal.signal(sig, signal.SIG_IGN)


def received() -> int | None:
    """The first signal received since :func:`install` (or :func:`reset`), or None."""
    return _received


def reset() -> None:
    """Forget a received signal (for tests and for programs that train again)."""
    global _received
    _received = None


def name(signum: int) -> str:
    return signal.Signals(signum).name


def _handler(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum
        return
    # a second signal: the user does not want to wait for the checkpoint
    try:
        sys.stderr.write(f"{name(signum)} again: exiting now, without waiting for the checkpoint\n")
        sys.stderr.flush()
    finally:
        os._exit(exit_code(_received))
