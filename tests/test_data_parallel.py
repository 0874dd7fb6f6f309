"""Data parallelism and ZeRO-1 give the single-device loss curve; ZeRO-1 shards optimizer state."""

import dataclasses

import numpy as np
import pytest

from tests.helpers import losses, tiny_config


@pytest.fixture(scope="module")
def single_device_losses():
    return losses(tiny_config(steps=20, devices=1))


@pytest.mark.parametrize("zero", [0, 1])
def test_data_parallel_matches_single_device(single_device_losses, zero):
    dp = losses(tiny_config(steps=20, devices=8, data=8, zero=zero))
    np.testing.assert_allclose(dp, single_device_losses, rtol=1e-5)
    assert dp[-1] < 0.8 * dp[0], "the tiny model learns"


def test_zero1_shards_optimizer_state_eight_ways():
    from colossal_jax.runtime.metrics import per_device_bytes
    from colossal_jax.training.run import build, init_state

    sizes = {}
    for zero in (0, 1):
        run = build(tiny_config(devices=8, data=8, zero=zero))
        params, opt_state = init_state(run)
        sizes[zero] = (per_device_bytes(params), per_device_bytes(opt_state))
    assert sizes[0][0] == sizes[1][0], "ZeRO-1 leaves parameters replicated"
    ratio = sizes[1][1] / sizes[0][1]
    assert abs(ratio - 1 / 8) <= 0.05 / 8, ratio


def test_zero1_memory_analysis_of_the_step():
    """The compiled step's argument bytes fall by 7/8 of the optimizer state under ZeRO-1."""
    from colossal_jax.runtime.metrics import per_device_bytes
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.run import build, init_state
    from colossal_jax.training.steps import make_train_step

    args = {}
    for zero in (0, 1):
        run = build(tiny_config(devices=8, data=8, zero=zero))
        params, opt_state = init_state(run)
        compiled = make_train_step(run).lower(params, opt_state, global_batch(run, 0)).compile()
        args[zero] = compiled.memory_analysis().argument_size_in_bytes
        if zero == 0:
            opt0 = per_device_bytes(opt_state)
    saved = args[0] - args[1]
    assert abs(saved - opt0 * 7 / 8) <= 0.05 * opt0, (args, opt0)


def test_precision_bf16_trains():
    cfg = tiny_config(steps=8, devices=8)
    out = losses(dataclasses.replace(cfg, precision="bf16"))
    assert np.all(np.isfinite(out)) and out[-1] < out[0]
