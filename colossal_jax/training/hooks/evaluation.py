"""Held-out evaluation: before the first step (not on a resume), every ``every`` steps and at the
last step, each written to the metrics file, so the summary reports what the file holds. The
metrics join the evaluated step's record (step 0's are a record of their own); the time they
take belongs to no step."""

from __future__ import annotations

from typing import Any

from colossal_jax.runtime import watchdog
from colossal_jax.runtime.metrics import MetricsWriter
from colossal_jax.training.evaluation import eval_data, evaluate_metrics
from colossal_jax.training.loop import Hook, Loop
from colossal_jax.training.run import Run
from colossal_jax.training.steps import make_eval_step


class Evaluation(Hook):
    """Evaluates ``run``'s held-out split (it must have one); ``losses``/``accuracies`` collect
    ``(step, value)`` of every evaluation (accuracies for image classifiers only)."""

    def __init__(self, run: Run, writer: MetricsWriter, every: int):
        self.step_fn, self.data = make_eval_step(run, stored=True), eval_data(run)
        self.run, self.writer, self.every = run, writer, every
        self.losses: list[tuple[int, float]] = []
        self.accuracies: list[tuple[int, float]] = []

    def start(self, loop: Loop) -> None:
        if loop.start_step > 0:  # a resume: report only evaluations the metrics file receives
            return
        watchdog.arm("the evaluation at step 0")
        first = self._evaluate(loop, 0)
        watchdog.disarm()
        self.writer.write({"step": 0, **first})

    def wants_state(self, loop: Loop, step: int) -> bool:
        return step % self.every == 0 or step == loop.last_step

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        if self.wants_state(loop, loop.step):
            with loop.clock.pause():
                metrics = self._evaluate(loop, loop.step)
            record.update(metrics)

    def _evaluate(self, loop: Loop, at: int) -> dict[str, float]:
        metrics = evaluate_metrics(self.run, loop.params, step_fn=self.step_fn, data=self.data)
        assert metrics is not None  # the hook is added only with a held-out split
        self.losses.append((at, metrics["eval_loss"]))
        if "eval_accuracy" in metrics:
            self.accuracies.append((at, metrics["eval_accuracy"]))
        return metrics
