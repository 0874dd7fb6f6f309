"""Checkpoints restore onto another mesh and continue the loss curve."""

import dataclasses
import shutil

import numpy as np
import pytest

from colossal_jax.training.trainer import train
from tests.helpers import losses, tiny_config


def _quiet(cfg):
    return train(cfg, progress=False, log=lambda _: None)


def test_resume_onto_another_mesh(tmp_path):
    full = losses(tiny_config(steps=8, devices=8, data=8))
    ckpt = {"checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    _quiet(dataclasses.replace(tiny_config(steps=8, devices=8, data=8), **ckpt))
    shutil.rmtree(tmp_path / "8")  # as if the run had died after its step-4 checkpoint
    # continue on a different mesh: 4 devices with ZeRO-1
    resumed = _quiet(dataclasses.replace(tiny_config(steps=8, devices=4, data=4, zero=1), **ckpt))
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full[4:], rtol=1e-5)


def test_a_data_parallel_checkpoint_resumes_in_a_pipeline(tmp_path):
    """The stacked parameters have the same shapes with or without ``pipe``: a checkpoint of
    ``data=8`` restores onto ``pipe=2,data=4`` (1F1B) and continues the same losses."""
    base = dict(steps=8, devices=8, batch_size=16)
    full = losses(tiny_config(**base, data=8))
    ckpt = {"checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    _quiet(dataclasses.replace(tiny_config(**base, data=8), **ckpt))
    shutil.rmtree(tmp_path / "8")
    piped = tiny_config(**base, data=4, pipe=2, pipeline="1f1b", microbatches=4)
    resumed = _quiet(dataclasses.replace(piped, **ckpt))
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full[4:], rtol=1e-5)


def test_a_zero3_offloaded_checkpoint_resumes_at_zero0(tmp_path):
    """ZeRO-3 with parameters and optimizer state in host memory saves a checkpoint that a plain
    data-parallel run restores and continues with the same losses (and the other way round)."""
    z3 = dict(zero=3)
    full = losses(tiny_config(steps=8, devices=8, data=8))
    ckpt = {"checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    _quiet(
        dataclasses.replace(tiny_config(steps=8, devices=8, data=8, **z3), offload="params", **ckpt)
    )
    shutil.rmtree(tmp_path / "8")
    resumed = _quiet(dataclasses.replace(tiny_config(steps=8, devices=8, data=8), **ckpt))
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full[4:], rtol=1e-5)


def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path):
    ckpt = {"checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    cfg = dataclasses.replace(tiny_config(steps=8, devices=8, data=8), precision="fp16")
    full = losses(cfg)
    _quiet(dataclasses.replace(cfg, **ckpt))
    shutil.rmtree(tmp_path / "8")
    resumed = _quiet(dataclasses.replace(cfg, **ckpt))
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full[4:], rtol=1e-6)
    assert float(resumed.opt_state.loss_scale.scale) == 2.0**15


def test_a_chunk_ordered_pipeline_saves_and_returns_model_order(tmp_path):
    """Interleaved 1F1B keeps its state in chunk order between steps; its checkpoint and the
    state it hands back are in model order: with the optimizer state in host memory it follows
    ``data=8``'s losses, returns ``data=8``'s parameters, and its step-4 checkpoint resumes under
    ZB-V (another chunk placement) with the same losses."""
    import jax

    def four(cfg):  # 4 layers: one per chunk at pipe=2 x V=2
        return dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, "n_layer": 4})

    base = dict(steps=8, devices=8, batch_size=16)
    full = _quiet(four(tiny_config(**base, data=8)))
    ckpt = {"checkpoint_dir": str(tmp_path), "checkpoint_every": 4}
    pipe = dict(data=4, pipe=2, microbatches=4, virtual_stages=2)
    inter = four(tiny_config(**base, **pipe, pipeline="interleaved", zero=1))
    got = _quiet(dataclasses.replace(inter, offload="optimizer", **ckpt))
    np.testing.assert_allclose(got.losses, full.losses, rtol=1e-5)
    # the held-out loss of the stored (chunk-ordered) state, during training and from outside
    assert got.eval_losses and len(got.eval_losses) == len(full.eval_losses)
    np.testing.assert_allclose(
        [v for _, v in got.eval_losses], [v for _, v in full.eval_losses], rtol=1e-5
    )
    from colossal_jax.training.evaluation import evaluate

    assert evaluate(got.run, got.params) == pytest.approx(full.final_eval_loss, rel=1e-5)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(full.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    shutil.rmtree(tmp_path / "8")
    zb_v = four(tiny_config(**base, **pipe, pipeline="zb-v"))
    resumed = _quiet(dataclasses.replace(zb_v, **ckpt))
    assert resumed.start_step == 4
    np.testing.assert_allclose(resumed.losses, full.losses[4:], rtol=1e-5)
