"""fp16 with dynamic loss scaling inside the real training step, and bf16/fp16 loss curves
against fp32 (issue: breaking the memory wall, acceptance 5)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from colossal_jax.config import ParallelConfig, TrainConfig
from colossal_jax.training.batches import global_batch
from colossal_jax.training.run import build, init_state
from colossal_jax.training.steps import make_train_step
from colossal_jax.training.trainer import train
from tests.helpers import tiny_config


def _same(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("zero", [0, 3])
def test_fp16_overflow_skips_the_step_and_halves_the_scale(zero):
    cfg = dataclasses.replace(
        tiny_config(steps=5, batch_size=8, data=8, zero=zero), precision="fp16", eval_every=0
    )
    run = build(cfg)
    params, opt_state = init_state(run)
    step = make_train_step(run)
    batch = global_batch(run, 0)
    # force an overflow: a loss scale no fp16 backward pass survives
    huge = opt_state.loss_scale._replace(scale=jnp.float32(2.0**100))
    opt_state = opt_state._replace(loss_scale=huge)
    before_p = jax.tree.map(np.asarray, params)
    before_o = jax.tree.map(np.asarray, opt_state.inner)
    params, opt_state, out = step(params, opt_state, batch)
    assert float(out["loss_scale"]) == 2.0**100
    assert int(out["skipped_steps"]) == 1
    assert float(opt_state.loss_scale.scale) == 2.0**99, "halved"
    assert int(opt_state.loss_scale.good_steps) == 0
    assert _same(params, before_p), "parameters unchanged on a skipped step"
    assert _same(opt_state.inner, before_o), "optimizer state unchanged on a skipped step"
    # back to a sane scale: the next steps are finite and change the parameters
    opt_state = opt_state._replace(
        loss_scale=opt_state.loss_scale._replace(scale=jnp.float32(2.0**15))
    )
    for i in range(1, 3):
        params, opt_state, out = step(params, opt_state, global_batch(run, i))
        assert np.isfinite(float(out["loss"]))
    assert int(opt_state.loss_scale.skipped) == 1
    assert not _same(params, before_p)


@pytest.mark.slow
def test_bf16_and_fp16_track_fp32_over_50_steps_of_the_default_run():
    """The default run (gpt2-tiny, batch 16 × 128, embedded corpus), 50 steps, data=8: the
    16-bit curves' 5-step moving average within 2% of fp32's at every step, and no single step
    over 3% (step 25 is a loss spike where one step's gap reached 1.5% with the bf16 embedding
    gradient and 2.0% with the float32 one, whose average gaps are 0.63% and 0.78%)."""

    def smooth(c: np.ndarray) -> np.ndarray:
        return np.convolve(c, np.ones(5) / 5, mode="valid")

    def curve(precision: str) -> np.ndarray:
        cfg = TrainConfig(
            steps=50, eval_every=0, precision=precision, parallel=ParallelConfig(data=8)
        )
        return np.array(train(cfg, progress=False, log=lambda _: None).losses)

    fp32 = curve("fp32")
    for precision in ("bf16", "fp16"):
        low = curve(precision)
        smoothed = np.max(np.abs(smooth(low) - smooth(fp32)) / smooth(fp32))
        rel = np.max(np.abs(low - fp32) / fp32)
        assert smoothed < 0.02 and rel < 0.03, (precision, smoothed, rel)
