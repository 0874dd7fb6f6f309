"""What a training step reports: its metrics record (loss, learning rate, gradient norm, time,
tokens/s, MFU) and, over a run, the throughput those records add up to.

The learning rates a record reports are computed a window of :data:`LR_WINDOW` steps at a time
(:class:`LearningRates`), so a run's host memory does not grow with ``--steps``: the whole
table of ``--steps 3000000000`` would be 24 GB of float64.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colossal_jax.config import OptimConfig
from colossal_jax.runtime.metrics import peak_flops
from colossal_jax.training.optim import schedule_values
from colossal_jax.training.run import Run

LR_WINDOW = 4096
"""Steps of learning rate computed at once (32 KiB of float64; one jitted call each)."""


@dataclass
class LearningRates:
    """The learning rate of each step of a run of ``total_steps`` steps
    (:func:`~colossal_jax.training.optim.schedule_values`), computed ``window`` steps at a time
    from the first step asked for: memory is constant in ``total_steps``."""

    optim: OptimConfig
    total_steps: int
    window: int = LR_WINDOW
    _first: int = field(default=0, init=False)
    _values: np.ndarray = field(default_factory=lambda: np.zeros(0), init=False)

    def __call__(self, step: int) -> float:
        """The learning rate of 0-based ``step`` (the step the optimizer's count reads)."""
        if not 0 <= step - self._first < len(self._values):
            stop = min(step + self.window, self.total_steps)
            self._values = schedule_values(self.optim, self.total_steps, step, stop)
            self._first = step
        return float(self._values[step - self._first])


RATE_WINDOW = 10
"""Steps a record's ``tokens_per_s`` and ``mfu`` average over (the step itself and those before
it). With the host overlapped, a step's time runs from the previous step's results to its own,
and on a GPU those results can arrive before the previous step's last work (host copies of
offloaded state) ended: one step's interval can then hold part of its neighbour's, 3.6 ms
against 70 ms measured on an H200 (docs/performance.md). Over a window the intervals tile the
steps' real time, so the rate is right to one boundary in ``RATE_WINDOW`` steps."""


@dataclass(frozen=True)
class Rates:
    """The per-step constants of a run's records: ``lr`` (the learning rate of a 0-based step),
    ``tokens_per_step``, ``flops_per_step`` (the model's FLOPs of one batch), ``peak`` (one
    device's peak FLOP/s, None where unknown) and ``devices`` (the mesh's size); ``recent``: the
    last :data:`RATE_WINDOW` steps' seconds."""

    start_step: int
    lr: Callable[[int], float]
    tokens_per_step: int
    flops_per_step: float
    peak: float | None
    devices: int
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    @classmethod
    def of(cls, run: Run, start_step: int) -> Rates:
        """The rates of ``run`` resumed at ``start_step`` (``--peak-tflops`` wins over the
        device's known peak)."""
        cfg = run.cfg
        lr = LearningRates(cfg.optim, cfg.steps)
        if start_step < cfg.steps:
            lr(start_step)  # the first window's compile and call, before any step is timed
        tokens_per_step = cfg.batch_size * cfg.seq_len
        flops_per_step = run.model.flops_per_token(cfg.seq_len) * tokens_per_step
        peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops()
        return cls(start_step, lr, tokens_per_step, flops_per_step, peak, run.mesh.size)

    def record(self, at: int, outputs: dict[str, Any], seconds: float) -> dict[str, Any]:
        """The record of step ``at`` from its read ``outputs`` and its time: ``step_time_s``
        the step's own interval, ``tokens_per_s`` and ``mfu`` (None where the peak is unknown)
        over the last :data:`RATE_WINDOW` steps read; fp16 adds ``loss_scale`` and
        ``skipped_steps``."""
        self.recent.append(seconds)
        steps, window_s = len(self.recent), sum(self.recent)
        record = {
            "step": at,
            "loss": float(outputs["loss"]),
            "lr": self.lr(at - 1),
            "grad_norm": float(outputs["grad_norm"]),
            "step_time_s": seconds,
            "tokens_per_s": self.tokens_per_step * steps / window_s,
            "mfu": self.mfu(steps, window_s),
        }
        for key in ("loss_scale", "skipped_steps"):
            if key in outputs:
                record[key] = outputs[key].item()
        return record

    def tokens_per_s(self, steps: int, seconds: float) -> float | None:
        """Tokens per second of ``steps`` steps that took ``seconds``; None for no time."""
        return self.tokens_per_step * steps / seconds if seconds else None

    def mfu(self, steps: int, seconds: float) -> float | None:
        """Model FLOP utilisation of ``steps`` steps that took ``seconds``; None where the peak
        is unknown or no time passed."""
        if not (self.peak and seconds):
            return None
        return self.flops_per_step * steps / seconds / (self.peak * self.devices)
