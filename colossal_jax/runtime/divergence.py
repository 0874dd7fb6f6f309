"""A diverged run stops before a non-finite state can reach a checkpoint.

The training loop already reads each step's loss to the host (``float(out["loss"])``) and its
gradient norm for the metrics; :class:`Guard` looks at those numbers, so the check costs no
device synchronisation of its own. A step whose loss or gradient norm is not finite stops the
run before that step's state is saved: the checkpoints on disk all hold the state of steps whose
loss and gradient norm were finite. The command line turns :class:`Diverged` into one line
``error: ...`` and exit status 3.

With ``--precision fp16`` a non-finite gradient is expected now and then: the loss scaler skips
the step (parameters and optimizer state unchanged, scale halved) and the run goes on. There the
run stops only when a step that was *not* skipped has a non-finite loss or gradient norm, or when
:data:`MAX_SKIPPED_IN_A_ROW` steps in a row were skipped (the scale has then fallen by 2^20: the
model, not the scale, is the problem).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

EXIT_CODE = 3
"""Exit status of a run stopped on a non-finite loss or gradient norm."""

MAX_SKIPPED_IN_A_ROW = 20
"""fp16: consecutive skipped steps after which the run is taken as diverged."""


class Diverged(Exception):
    """The run stopped on a non-finite loss or gradient norm; ``line`` names the step and the
    last good checkpoint."""

    def __init__(self, step: int, reason: str, line: str):
        super().__init__(line)
        self.step = step
        self.reason = reason
        self.line = line


@dataclass
class Guard:
    """Per-step finiteness check. ``skipped`` is the loss scaler's count of skipped steps before
    the first step this run takes (fp16), or None without loss scaling."""

    skipped: int | None = None
    in_a_row: int = 0

    def check(self, loss: float, grad_norm: float, skipped_total: int | None = None) -> str | None:
        """None if the step may be kept (and saved), else why not (``loss is nan``)."""
        step_skipped = False
        if skipped_total is not None:
            step_skipped = self.skipped is not None and skipped_total > self.skipped
            self.skipped = skipped_total
        if step_skipped:
            self.in_a_row += 1
            if self.in_a_row >= MAX_SKIPPED_IN_A_ROW:
                return (
                    f"{self.in_a_row} steps in a row were skipped on non-finite fp16 gradients "
                    f"(loss {loss:.4g})"
                )
            return None
        self.in_a_row = 0
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if not math.isfinite(grad_norm):
            return f"gradient norm is {grad_norm} (loss {loss:.6g})"
        return None


def stop_line(reason: str, step: int, checkpoint_dir: str | None, last_good: int | None) -> str:
    """``loss is nan at step 7; stopped without saving; the last good checkpoint is step 4 in
    DIR`` (what the command line prints after ``error:``)."""
    head = f"{reason} at step {step}"
    if checkpoint_dir is None:
        return f"{head}; stopped (no --checkpoint-dir: nothing was saved)"
    if last_good is None:
        return f"{head}; stopped without saving; {checkpoint_dir} holds no checkpoint yet"
    return (
        f"{head}; stopped without saving; the last good checkpoint is step {last_good} in "
        f"{checkpoint_dir}"
    )
