"""Elastic restarts: a checkpoint of ``data=8`` resumes on other meshes and device counts with
the same global batch, so the next losses are those of the uninterrupted run (issue 9,
acceptance 2). ``device_batch`` derives the accumulation count from the mesh
(``rules.grad_accum_of``)."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from colossal_jax.config import ConfigError, ParallelConfig
from colossal_jax.config.model_rules import check_with_model, grad_accum_of
from colossal_jax.config.parallel_rules import check_parallel
from colossal_jax.config.train_rules import check_train
from colossal_jax.training.trainer import train
from tests.helpers import tiny_config

# batch 16 = 2 sequences per shard on data=8; TINY_MODEL (hidden 64, 4 heads, mlp 256, the
# 256-byte vocabulary, block 64) divides for 1d over 4 and for 3d on a 2×2×2 cube
BASE = dict(steps=10, batch_size=16, seq_len=32)


def _quiet(cfg):
    return train(cfg, progress=False, log=lambda _: None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The uninterrupted ``data=8`` run's losses, and its checkpoint at step 5."""
    root = tmp_path_factory.mktemp("elastic")
    cfg = dataclasses.replace(
        tiny_config(**BASE, devices=8, data=8), checkpoint_dir=str(root), checkpoint_every=5
    )
    full = _quiet(cfg).losses
    shutil.rmtree(root / "10")  # as if the run had died after its step-5 checkpoint
    return full, root


@pytest.mark.parametrize(
    "devices,parallel,device_batch,accum",
    [
        (8, dict(data=2, tensor_row=4, tensor_mode="1d"), None, 1),
        (4, dict(data=4), 2, 2),
        # the "3d device_batch=1" case below restores onto the same 3d cube (and accumulates
        # on it): it covers this restore path; -m exhaustive runs this
        pytest.param(
            8,
            dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
            None,
            1,
            marks=pytest.mark.exhaustive,
        ),
        (8, dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"), 1, 4),
    ],
    ids=[
        "data=2,tensor=4 1d",
        "4 devices data=4 device_batch=2",
        "tensor=8 3d",
        "3d device_batch=1",
    ],
)
def test_a_data8_checkpoint_resumes_elsewhere_with_the_same_losses(
    devices, parallel, device_batch, accum, saved, tmp_path
):
    full, root = saved
    ckpt = tmp_path / "ckpt"
    shutil.copytree(root, ckpt)
    cfg = dataclasses.replace(
        tiny_config(**BASE, devices=devices, **parallel),
        checkpoint_dir=str(ckpt),
        checkpoint_every=5,
        device_batch=device_batch,
    )
    assert grad_accum_of(cfg) == accum
    resumed = _quiet(cfg)
    assert resumed.start_step == 5
    np.testing.assert_allclose(resumed.losses, full[5:], rtol=1e-4)


def _cfg(batch: int, device_batch: int | None, grad_accum: int = 1, **par):
    return dataclasses.replace(
        tiny_config(batch_size=batch),
        device_batch=device_batch,
        grad_accum=grad_accum,
        parallel=ParallelConfig(**par),
    )


def test_device_batch_derives_the_accumulation_from_the_mesh():
    assert grad_accum_of(_cfg(32, None, 3, data=8)) == 3
    assert grad_accum_of(_cfg(32, 2, data=8)) == 2
    assert grad_accum_of(_cfg(32, 2, data=4)) == 4
    assert grad_accum_of(_cfg(32, 2, data=2, tensor_row=4, tensor_mode="1d")) == 8
    cube = dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d")
    assert grad_accum_of(_cfg(32, 2, **cube)) == 4  # 3d splits the batch q² = 4 ways
    # with a pipeline, each of its M microbatches is accumulated: 32 / (4 shards · 4 M · 1)
    assert grad_accum_of(_cfg(32, 1, data=4, pipe=2, microbatches=4)) == 2
    assert grad_accum_of(_cfg(32, 2, 2, data=8)) == 2  # a consistent --grad-accum


@pytest.mark.parametrize(
    "batch,device_batch,grad_accum,par,message",
    [
        (16, 3, 1, dict(data=8), "--device-batch 3 does not divide the 2 sequences per shard"),
        (16, 3, 1, dict(data=8), "use --device-batch 2, or --batch-size 24"),
        (24, 2, 1, dict(data=8), "use --device-batch 1 or 3, or --batch-size 32"),
        (16, 1, 4, dict(data=8), "--grad-accum 4 contradicts --device-batch 1"),
        (16, 1, 4, dict(data=8), "use --grad-accum 2"),
        (16, 0, 1, dict(data=8), "--device-batch 0 must be at least 1"),
        (
            24,
            1,
            1,
            dict(data=4, pipe=2, microbatches=4),
            "--batch-size 24 does not split over the 4 batch shards",
        ),
    ],
)
def test_device_batch_rules(batch, device_batch, grad_accum, par, message):
    from colossal_jax.config.families import model_config

    cfg = _cfg(batch, device_batch, grad_accum, **par)
    model = model_config(cfg.model, **cfg.model_overrides)
    with pytest.raises(ConfigError, match=None) as info:
        check_parallel(cfg.parallel)
        check_train(cfg)
        check_with_model(cfg, model)
    assert message in str(info.value), str(info.value)
