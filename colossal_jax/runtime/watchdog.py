"""A lost peer in a multi-process run: exit with one line instead of hanging.

When a process of a multi-process run dies (SIGKILL, a crashed host), the others are left
waiting inside a collective of the step they are in (gloo on CPU, NCCL on GPU), which may never
return. :func:`start` (called by the command line after ``jax.distributed.initialize``) runs a
daemon thread that watches the training loop: :func:`arm` before each step (and before each
save or evaluation that talks to the other processes), :func:`disarm` once it is done. A step
that has not finished within ``--peer-timeout`` seconds means a peer is gone: the thread names
the process whose beats in the key-value store of JAX's coordination service stopped
(:class:`Beats`; ``get_live_nodes`` cannot be used, it waits for every live process), prints

    error: lost contact with process 1 (step 12 unfinished after 20s); exiting

(naming the other processes when the service cannot tell, e.g. because the coordinator,
process 0, is the one that died) and ends the process with ``os._exit`` (status
:data:`colossal_jax.cli.PEER_LOST_EXIT`): no clean shutdown, which would wait for the dead peer
in turn. JAX's own heartbeat (``heartbeat_timeout_seconds``, three times the timeout) is the
second line of defence: the coordination service then aborts the survivors itself.

Single-process runs never start the thread; :func:`arm` and :func:`disarm` are then no-ops.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_armed_at: float | None = None
_what = ""
_thread: threading.Thread | None = None
_stopping = threading.Event()


def arm(what: str) -> None:
    """A step (or save, evaluation) that needs every process starts now; ``what`` names it."""
    global _armed_at, _what
    if _thread is None:
        return
    with _lock:
        _armed_at = time.monotonic()
        _what = what


def disarm() -> None:
    """The step armed last has finished."""
    global _armed_at
    if _thread is None:
        return
    with _lock:
        _armed_at = None


BEAT_EVERY = 1.0
"""Seconds between two beats of a process in the coordination service's key-value store."""
_PREFIX = "colossal_jax/watchdog/"


class Beats:
    """Liveness of every process from the key-value store of JAX's coordination service: each
    process bumps its own counter every :data:`BEAT_EVERY` seconds (:meth:`beat`) and records
    when it last saw each peer's counter change. Clock-free: only local ``time.monotonic`` is
    compared. ``client`` is ``jax._src.distributed.global_state.client`` (or a fake)."""

    def __init__(self, client, me: int, count: int, clock: Callable[[], float] = time.monotonic):
        self.client, self.me, self.count, self.clock = client, me, count, clock
        now = clock()
        self.seen: dict[int, tuple[str, float]] = {i: ("", now) for i in range(count)}
        self.last_ok = now  # the last time the store answered
        self.counter = 0

    def beat(self) -> None:
        """Publish this process's counter and read the others' (raises if the store is gone)."""
        self.counter += 1
        self.client.key_value_set(f"{_PREFIX}{self.me}", str(self.counter), True)
        values = dict(self.client.key_value_dir_get(_PREFIX))
        now = self.clock()
        self.last_ok = now
        for i in range(self.count):
            value = values.get(f"{_PREFIX}{i}", "")
            if value != self.seen[i][0]:
                self.seen[i] = (value, now)

    def lost(self, silent_for: float) -> list[int]:
        """The peers whose counter has not moved for ``silent_for`` seconds; process 0 (which
        hosts the store) when the store itself has not answered for that long; all the peers
        when nothing points at one."""
        now = self.clock()
        others = [i for i in range(self.count) if i != self.me]
        if now - self.last_ok >= silent_for:
            return [0] if self.me != 0 else others
        lost = [i for i in others if now - self.seen[i][1] >= silent_for]
        return lost or others


def lost_line(lost: list[int], timeout: float, what: str) -> str:
    """``error: lost contact with process 1 (...); exiting`` for the processes ``lost``."""
    who = f"process {lost[0]}" if len(lost) == 1 else "processes " + ", ".join(str(i) for i in lost)
    return f"error: lost contact with {who} ({what} unfinished after {timeout:g}s); exiting"


def start(timeout: float, *, exit_code: int) -> None:
    """Watch the armed steps of this process (idempotent); exit with ``exit_code`` and one line
    when one stays unfinished for ``timeout`` seconds. Needs ``jax.distributed`` initialized."""
    global _thread
    import jax
    from jax._src import distributed

    if _thread is not None or jax.process_count() < 2 or distributed.global_state.client is None:
        return
    beats = Beats(distributed.global_state.client, jax.process_index(), jax.process_count())

    def beat() -> None:  # its own thread: an RPC to a dead coordinator may block a while
        while not _stopping.is_set():
            try:
                beats.beat()
            except Exception:  # noqa: BLE001 (the store is gone: beats.last_ok ages)
                pass
            _stopping.wait(BEAT_EVERY)

    def watch() -> None:
        while True:
            time.sleep(min(1.0, timeout / 10))
            with _lock:
                started, what = _armed_at, _what
            if started is None or time.monotonic() - started < timeout:
                continue
            lost = beats.lost(silent_for=min(timeout / 2, 5 * BEAT_EVERY))
            try:
                sys.stdout.flush()
                sys.stderr.write(lost_line(lost, timeout, what) + "\n")
                sys.stderr.flush()
            finally:
                os._exit(exit_code)

    beater = threading.Thread(target=beat, name="colossal-peer-beat", daemon=True)
    beater.start()
    _thread = threading.Thread(target=watch, name="colossal-peer-watchdog", daemon=True)
    _thread.start()
    atexit.register(_stop_beating, beater)


def _stop_beating(beater: threading.Thread) -> None:
    """At exit, before JAX's own clean-up (registered when JAX was imported, so run after this)
    shuts the distributed client down: stop the beats and wait for one in flight, so that no
    RPC runs on a client being destroyed (a C++ exception there aborts the process at exit)."""
    _stopping.set()
    beater.join(timeout=BEAT_EVERY + 10.0)
