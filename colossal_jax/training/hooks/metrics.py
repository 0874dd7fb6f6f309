"""Each step's record to the JSON-lines file and TensorBoard: every ``log_every`` steps, the
last step and every evaluated step (its record carries the held-out metrics), with the device's
peak memory where the backend reports it."""

from __future__ import annotations

from typing import Any

from colossal_jax.runtime.metrics import MetricsWriter, device_memory
from colossal_jax.training.loop import Hook, Loop


class Metrics(Hook):
    """Records are held from their ``result`` until the step's ``state`` hooks have run (an
    evaluation adds to the record), then written; ``writer`` is closed with the loop."""

    def __init__(self, writer: MetricsWriter, every: int):
        self.writer = writer
        self.every = every
        self.unwritten: list[dict[str, Any]] = []

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        if (mem := device_memory()) is not None:
            record["peak_bytes_in_use"] = mem["peak_bytes_in_use"]
        self.unwritten.append(record)

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        self._write(loop)

    def after_step(self, loop: Loop) -> None:
        self._write(loop)

    def close(self, loop: Loop) -> None:
        self.writer.close()

    def _write(self, loop: Loop) -> None:
        for record in self.unwritten:
            step = record["step"]
            if step % self.every == 0 or step == loop.last_step or "eval_loss" in record:
                self.writer.write(record)
        self.unwritten.clear()
