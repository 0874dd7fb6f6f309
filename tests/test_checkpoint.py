"""Checkpoints restore onto another mesh and continue the loss curve.

One uninterrupted ``data=8`` run with checkpoints at steps 2 and 4 (a module fixture) is the
reference curve, parameters and held-out losses of the tests below, and its step-2 checkpoint
(step 4's removed, as if the run had died after step 2's save) is what most of them resume."""

import dataclasses
import shutil

import numpy as np
import pytest

from colossal_jax.training.trainer import train
from tests.helpers import tiny_config

BASE = dict(steps=4, batch_size=16)


def _quiet(cfg):
    return train(cfg, progress=False, log=lambda _: None)


def _four(cfg):  # 4 layers: one per chunk at pipe=2 x V=2
    return dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, "n_layer": 4})


def _ckpt(path) -> dict:
    return {"checkpoint_dir": str(path), "checkpoint_every": 2}


def _no_eval(cfg):  # a resume's held-out loss is not what these tests check: not compiled
    return dataclasses.replace(cfg, eval_every=0)


@pytest.fixture(scope="module")
def data8(tmp_path_factory):
    """``data=8``'s run to step 4 (held-out loss at steps 0 and 4) and its checkpoint folder."""
    path = tmp_path_factory.mktemp("data8")
    return _quiet(dataclasses.replace(_four(tiny_config(**BASE, data=8)), **_ckpt(path))), path


def _died_after_step_2(data8, tmp_path) -> dict:
    """A copy of ``data8``'s checkpoints without step 4's: the checkpoint settings to resume it."""
    shutil.copytree(data8[1], tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck" / "4")
    return _ckpt(tmp_path / "ck")


def test_resume_onto_another_mesh(data8, tmp_path):
    # continue on a different mesh: 4 devices with ZeRO-1
    other = _no_eval(_four(tiny_config(**BASE, devices=4, data=4, zero=1)))
    resumed = _quiet(dataclasses.replace(other, **_died_after_step_2(data8, tmp_path)))
    assert resumed.start_step == 2
    np.testing.assert_allclose(resumed.losses, data8[0].losses[2:], rtol=1e-5)


def test_a_data_parallel_checkpoint_resumes_in_a_pipeline(data8, tmp_path):
    """The stacked parameters have the same shapes with or without ``pipe``: a checkpoint of
    ``data=8`` restores onto ``pipe=2,data=4`` (1F1B) and continues the same losses."""
    piped = _four(tiny_config(**BASE, data=4, pipe=2, pipeline="1f1b", microbatches=4))
    resumed = _quiet(dataclasses.replace(_no_eval(piped), **_died_after_step_2(data8, tmp_path)))
    assert resumed.start_step == 2
    np.testing.assert_allclose(resumed.losses, data8[0].losses[2:], rtol=1e-5)


def test_a_zero3_offloaded_checkpoint_resumes_at_zero0(data8, tmp_path):
    """ZeRO-3 with parameters and optimizer state in host memory saves a checkpoint that a plain
    data-parallel run restores and continues with the same losses."""
    z3 = _no_eval(_four(tiny_config(**BASE, data=8, zero=3)))
    _quiet(dataclasses.replace(z3, offload="params", **_ckpt(tmp_path)))
    shutil.rmtree(tmp_path / "4")
    plain = _no_eval(_four(tiny_config(**BASE, data=8)))
    resumed = _quiet(dataclasses.replace(plain, **_ckpt(tmp_path)))
    assert resumed.start_step == 2
    np.testing.assert_allclose(resumed.losses, data8[0].losses[2:], rtol=1e-5)


def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path):
    cfg = _no_eval(dataclasses.replace(tiny_config(**BASE, data=8), precision="fp16"))
    full = _quiet(dataclasses.replace(cfg, **_ckpt(tmp_path))).losses  # uninterrupted
    shutil.rmtree(tmp_path / "4")
    resumed = _quiet(dataclasses.replace(cfg, **_ckpt(tmp_path)))
    assert resumed.start_step == 2
    np.testing.assert_allclose(resumed.losses, full[2:], rtol=1e-6)
    assert float(resumed.opt_state.loss_scale.scale) == 2.0**15


def test_a_chunk_ordered_pipeline_saves_and_returns_model_order(data8, tmp_path):
    """Interleaved 1F1B keeps its state in chunk order between steps; its checkpoint and the
    state it hands back are in model order: with the optimizer state in host memory it follows
    ``data=8``'s losses, returns ``data=8``'s parameters, and its step-2 checkpoint resumes under
    ZB-V (another chunk placement) with the same losses."""
    import jax

    full = data8[0]
    pipe = dict(data=4, pipe=2, microbatches=4, virtual_stages=2)
    inter = _four(tiny_config(**BASE, **pipe, pipeline="interleaved", zero=1))
    got = _quiet(dataclasses.replace(inter, offload="optimizer", **_ckpt(tmp_path)))
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
    shutil.rmtree(tmp_path / "4")
    zb_v = _no_eval(_four(tiny_config(**BASE, **pipe, pipeline="zb-v")))
    resumed = _quiet(dataclasses.replace(zb_v, **_ckpt(tmp_path)))
    assert resumed.start_step == 2
    np.testing.assert_allclose(resumed.losses, full.losses[2:], rtol=1e-5)
