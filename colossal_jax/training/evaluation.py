"""Held-out metrics of a run's parameters: the weighted mean loss over fixed held-out batches
and, for image classification, the accuracy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from colossal_jax.training.batches import place_batch
from colossal_jax.training.run import Run
from colossal_jax.training.steps import make_eval_step


def eval_data(run: Run) -> list[dict[str, jax.Array]]:
    """The fixed held-out batches of every evaluation (empty without a held-out split):
    ``eval_batches`` of them, or for images as many as cover the held-out images once."""
    if run.eval_batches is None:
        return []
    n = run.eval_batches.evaluation_batches(run.cfg.eval_batches)
    return [place_batch(run, run.eval_batches.batch(i)) for i in range(n)]


def evaluate_metrics(
    run: Run,
    params: Any,
    *,
    step_fn: Callable | None = None,
    data: list[dict[str, jax.Array]] | None = None,
) -> dict[str, float] | None:
    """Held-out metrics of ``params``: ``eval_loss`` (the weighted mean over the held-out
    batches) and, for image classification, ``eval_accuracy`` (a fraction); None without a
    held-out split. ``params`` must be in ``run.param_shardings``; ``step_fn``/``data`` reuse a
    compiled :func:`~colossal_jax.training.steps.make_eval_step` and :func:`eval_data`."""
    data = eval_data(run) if data is None else data
    if not data:
        return None
    step_fn = make_eval_step(run) if step_fn is None else step_fn
    outs = [jax.device_get(step_fn(params, b)) for b in data]
    count = sum(float(o["count"]) for o in outs)
    weight = max(count, 1.0)
    metrics = {"eval_loss": sum(float(o["loss"]) * float(o["count"]) for o in outs) / weight}
    if "correct" in outs[0]:
        metrics["eval_accuracy"] = sum(float(o["correct"]) for o in outs) / weight
    return metrics


def evaluate(
    run: Run,
    params: Any,
    *,
    step_fn: Callable | None = None,
    data: list[dict[str, jax.Array]] | None = None,
) -> float | None:
    """Held-out loss of ``params`` (None without a held-out split); see
    :func:`evaluate_metrics` for the accuracy of image classifiers."""
    metrics = evaluate_metrics(run, params, step_fn=step_fn, data=data)
    return None if metrics is None else metrics["eval_loss"]
