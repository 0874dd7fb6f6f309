"""What a training step reports: its metrics record (loss, learning rate, gradient norm, time,
tokens/s, MFU) and, over a run, the throughput those records add up to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from colossal_jax.runtime.metrics import peak_flops
from colossal_jax.training.optim import schedule_values
from colossal_jax.training.run import Run


@dataclass(frozen=True)
class Rates:
    """The per-step constants of a run's records: ``lr_values`` from ``start_step`` on,
    ``tokens_per_step``, ``flops_per_step`` (the model's FLOPs of one batch), ``peak`` (one
    device's peak FLOP/s, None where unknown) and ``devices`` (the mesh's size)."""

    start_step: int
    lr_values: np.ndarray
    tokens_per_step: int
    flops_per_step: float
    peak: float | None
    devices: int

    @classmethod
    def of(cls, run: Run, start_step: int) -> Rates:
        """The rates of ``run`` resumed at ``start_step`` (``--peak-tflops`` wins over the
        device's known peak)."""
        cfg = run.cfg
        lr_values = schedule_values(cfg.optim, cfg.steps, start_step, cfg.steps)
        tokens_per_step = cfg.batch_size * cfg.seq_len
        flops_per_step = run.model.flops_per_token(cfg.seq_len) * tokens_per_step
        peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops()
        return cls(start_step, lr_values, tokens_per_step, flops_per_step, peak, run.mesh.size)

    def record(self, at: int, outputs: dict[str, Any], seconds: float) -> dict[str, Any]:
        """The record of step ``at`` from its read ``outputs`` and its time (``mfu`` None where
        the peak is unknown); fp16 adds ``loss_scale`` and ``skipped_steps``."""
        tokens_per_s = self.tokens_per_step / seconds
        record = {
            "step": at,
            "loss": float(outputs["loss"]),
            "lr": float(self.lr_values[at - 1 - self.start_step]),
            "grad_norm": float(outputs["grad_norm"]),
            "step_time_s": seconds,
            "tokens_per_s": tokens_per_s,
            "mfu": (
                self.flops_per_step / seconds / (self.peak * self.devices) if self.peak else None
            ),
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
