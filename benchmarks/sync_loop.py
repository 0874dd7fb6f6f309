"""A copy of the synchronous training loop of ``colossal_jax.training`` as it was before this
harness existed: the next batch is built only after the step returns, the host waits for every
step (``float(loss)``, ``float(grad_norm)``) before dispatching the next one, and the learning
rate is evaluated by the optax schedule step by step.

``scripts/bench_throughput.py`` times it next to today's ``train()`` loop in one invocation, so
the gain is measured, not asserted. What it keeps of the old loop's
per-step work: the batch build and placement, the step, the metrics record (loss, lr,
grad_norm, step time, tokens/s, MFU, peak memory where reported) and the non-finite guard.
What it leaves out (it would be equally absent or equally present in both loops in a benchmark
run): the progress bar, evaluation, checkpoints, signals and the watchdog.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colossal_jax.config import TrainConfig
from colossal_jax.runtime.divergence import Guard
from colossal_jax.runtime.metrics import device_memory
from colossal_jax.training.batches import global_batch
from colossal_jax.training.optim import schedule
from colossal_jax.training.run import Run, build, init_state
from colossal_jax.training.stack_order import to_stored
from colossal_jax.training.steps import make_train_step


@dataclass
class LoopTiming:
    """Wall time of ``steps`` steps of a loop and what they leave behind."""

    steps: int
    loop_s: float
    host_s: float
    """``loop_s`` less the time inside the step's call and ``float(loss)``'s wait"""
    step_times: list[float]
    """each iteration's wall time, batch building included"""
    tokens_per_s: float
    losses: list[float]
    params: Any
    opt_state: Any


def sync_loop(
    run: Run,
    compiled: Callable,
    params: Any,
    opt_state: Any,
    *,
    start: int,
    steps: int,
    peak_flops: float | None = None,
) -> LoopTiming:
    """Run ``steps`` steps from step ``start`` the old, synchronous way; ``compiled`` is the
    compiled train step (``make_train_step(run)`` lowered and compiled)."""
    cfg = run.cfg
    lr_at = schedule(cfg.optim, cfg.steps)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    flops_per_step = run.model.flops_per_token(cfg.seq_len) * tokens_per_step
    n_dev = run.mesh.size
    guard = Guard(skipped=None)
    losses: list[float] = []
    step_times: list[float] = []
    in_step = 0.0
    t_loop = time.perf_counter()
    for step in range(start, start + steps):
        t_iter = time.perf_counter()
        batch = global_batch(run, step)
        t0 = time.perf_counter()
        params, opt_state, out = compiled(params, opt_state, batch)
        loss = float(out["loss"])
        dt = time.perf_counter() - t0
        in_step += dt
        losses.append(loss)
        record = {
            "step": step + 1,
            "loss": loss,
            "lr": float(lr_at(step)),
            "grad_norm": float(out["grad_norm"]),
            "step_time_s": dt,
            "tokens_per_s": tokens_per_step / dt,
            "mfu": flops_per_step / dt / (peak_flops * n_dev) if peak_flops else None,
        }
        bad = guard.check(loss, record["grad_norm"], None)
        if bad is not None:
            raise RuntimeError(f"the synchronous loop diverged at step {step + 1}: {bad}")
        if (mem := device_memory()) is not None:
            record["peak_bytes_in_use"] = mem["peak_bytes_in_use"]
        step_times.append(time.perf_counter() - t_iter)
    loop_s = time.perf_counter() - t_loop
    return LoopTiming(
        steps,
        loop_s,
        loop_s - in_step,
        step_times,
        steps * tokens_per_step / loop_s,
        losses,
        params,
        opt_state,
    )


def sync_train(cfg: TrainConfig, peak_flops: float | None = None) -> LoopTiming:
    """The old ``train()`` without its logging, evaluation and checkpoints: build the run,
    initialise the state, compile the step (from JAX's persistent cache where it holds it, as
    for ``train()``), then :func:`sync_loop` for ``cfg.steps`` steps from step 0 — the same
    set-up as a ``train()`` window, so both loops start on a fresh executable and fresh
    arrays."""
    run = build(cfg)
    params, opt_state = to_stored(run, *init_state(run))
    compiled = make_train_step(run).lower(params, opt_state, global_batch(run, 0)).compile()
    return sync_loop(
        run, compiled, params, opt_state, start=0, steps=cfg.steps, peak_flops=peak_flops
    )
