"""The divergence guard (:mod:`colossal_jax.runtime.divergence`) on each step's record: a
non-finite loss or gradient norm stops the run before that step's state can be saved, with the
record of the failed step written for the post-mortem."""

from __future__ import annotations

from typing import Any

from colossal_jax.runtime.divergence import Diverged, Guard, stop_line
from colossal_jax.runtime.metrics import MetricsWriter
from colossal_jax.training.checkpoint import Checkpointer
from colossal_jax.training.loop import Hook, Loop


class DivergenceGuard(Hook):
    """Raises :class:`Diverged` at the first step the guard refuses. ``opt_state``: the state the
    run starts from (fp16: its loss scaler's count of skipped steps so far)."""

    def __init__(self, opt_state: Any, writer: MetricsWriter, ckpt: Checkpointer | None):
        self.guard = Guard(skipped=skipped_so_far(opt_state))
        self.writer, self.ckpt = writer, ckpt

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        at = record["step"]
        bad = self.guard.check(record["loss"], record["grad_norm"], record.get("skipped_steps"))
        if bad is None:
            return
        self.writer.write(record)  # the record of the failed step, for the post-mortem
        last_good = self.ckpt.wait() if self.ckpt is not None else None
        raise Diverged(at, bad, stop_line(bad, at, loop.run.cfg.checkpoint_dir, last_good))


def skipped_so_far(opt_state: Any) -> int | None:
    """fp16: the loss scaler's count of skipped steps in ``opt_state``; None without one."""
    scale = getattr(opt_state, "loss_scale", None)
    return None if scale is None else int(scale.skipped)
