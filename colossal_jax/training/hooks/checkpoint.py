"""Asynchronous checkpoints: the state of every ``checkpoint_every``-th step, of the last step
and of the step a run stops at on a signal, saved once its loss and gradient norm were read
(the divergence guard runs first); after the loop, the last save is waited for."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from colossal_jax.config import TrainConfig
from colossal_jax.config.families import ModelConfig
from colossal_jax.config.model_rules import grad_accum_of
from colossal_jax.runtime import watchdog
from colossal_jax.training.checkpoint import Checkpointer
from colossal_jax.training.loop import Hook, Loop
from colossal_jax.training.stack_order import to_model, to_stored


class Checkpointing(Hook):
    """Saves into ``ckpt`` (which the caller closes); the time a save takes belongs to no step."""

    def __init__(self, ckpt: Checkpointer):
        self.ckpt = ckpt

    def wants_state(self, loop: Loop, step: int) -> bool:
        return self.ckpt.due(step) or step == loop.last_step or bool(loop.stop)

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        if not self.wants_state(loop, loop.step):
            return
        run = loop.run
        with loop.clock.pause():
            # checkpoints hold model order; a chunk-ordered state goes there and back (donated:
            # the save has copied the arrays to the host when it returns)
            params, opt_state = to_model(run, loop.params, loop.opt_state)
            self.ckpt.save(
                loop.step,
                {"params": params, "opt_state": opt_state},
                checkpoint_meta(run.cfg, loop.step, run.model),
                force=True,
            )
            loop.params, loop.opt_state = to_stored(run, params, opt_state)

    def end(self, loop: Loop) -> None:
        watchdog.arm(f"the checkpoint of step {loop.step}")
        self.ckpt.wait()
        watchdog.disarm()


def checkpoint_meta(cfg: TrainConfig, step: int, model: ModelConfig | None = None) -> dict:
    """The JSON saved with a checkpoint; ``architecture`` (the resolved model config, the data's
    vocabulary included) is what ``preflight.check_resume`` compares a resume against."""
    meta = {
        "step": step,
        "data_position": step,  # batches are a pure function of (seed, step)
        "seed": cfg.seed,
        "model": cfg.model,
        "mesh": cfg.parallel.short(),
        "grad_accum": grad_accum_of(cfg),
        "config": _jsonable(dataclasses.asdict(cfg)),
    }
    if model is not None:
        meta["architecture"] = _jsonable(dataclasses.asdict(model))
    return meta


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
