"""The peer watchdog (:mod:`colossal_jax.runtime.watchdog`) armed for each step, through its
evaluation and save, and disarmed when the iteration ends; a no-op in a single-process run."""

from __future__ import annotations

from colossal_jax.runtime import watchdog
from colossal_jax.training.loop import Hook, Loop


class PeerWatchdog(Hook):
    """Arms the watchdog before each step and disarms it after (and when the loop ends)."""

    def before_step(self, loop: Loop, number: int) -> None:
        watchdog.arm(f"step {number}")

    def after_step(self, loop: Loop) -> None:
        watchdog.disarm()

    def close(self, loop: Loop) -> None:
        watchdog.disarm()
