"""Zero-bubble pipelines (ZB-H1, ZB-V) against data parallelism: loss curves with the
tensor, sequence, ZeRO, accumulation and remat modes, BERT and LLaMA, and 3D tensor parallelism
on 16 devices (all slow; the tick tables, one-step gradients and FLOPs are in
``tests/test_zero_bubble.py``, kept apart so the two files run on both test workers)."""

from __future__ import annotations

import numpy as np
import pytest

from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig
from tests.helpers import losses
from tests.test_zero_bubble import ZBV, _cfg, _v


@pytest.fixture(scope="module")
def data_parallel_losses():
    return losses(_cfg(data=8))


CURVES = {  # each mode at least once, combined so that the suite stays within its time
    "zb-h1-p4": dict(pipe=4, data=2, pipeline="zb-h1", microbatches=8),
    "zb-v-p4": dict(pipe=4, data=2, microbatches=8, **ZBV),
    "zb-h1-1d-zero1": dict(
        pipe=2, data=2, tensor_row=2, tensor_mode="1d", zero=1, pipeline="zb-h1"
    ),
    "zb-v-1d-cm-zero2": dict(
        pipe=2, data=2, tensor_row=2, tensor_mode="1d", collective_matmul=True, zero=2, **ZBV
    ),
    "zb-h1-2d-remat": dict(
        pipe=2, tensor_row=2, tensor_col=2, tensor_mode="2d", remat="full", pipeline="zb-h1"
    ),
    "zb-v-2.5d": dict(
        pipe=2, tensor_row=2, tensor_col=2, tensor_depth=1, tensor_mode="2.5d", **ZBV
    ),
    "zb-v-ring-zero3-accum2": dict(
        pipe=2, seq=2, data=2, seq_mode="ring", zero=3, grad_accum=2, **ZBV
    ),
    "zb-h1-ulysses-zero3-1d-accum2": dict(
        pipe=2,
        seq=2,
        tensor_row=2,
        tensor_mode="1d",
        seq_mode="ulysses",
        zero=3,
        grad_accum=2,
        pipeline="zb-h1",
    ),
}


IN_EVERY_RUN = ("zb-v-p4",)
"""The curves the default suite runs; the mode combinations and ZB-H1's plain curve (its one-step
gradients against the unpipelined step, ``tests/test_zero_bubble.py``, run by default) are
``exhaustive`` (pyproject.toml: ``pytest -m exhaustive`` runs them, about five minutes on two
cores)."""


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [n if n in IN_EVERY_RUN else pytest.param(n, marks=pytest.mark.exhaustive) for n in CURVES],
)
def test_zero_bubble_gives_the_data_parallel_loss_curve(name, data_parallel_losses):
    got = losses(_cfg(**CURVES[name]))
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)


FAMILIES = {
    "bert": dict(
        model="bert-tiny",
        model_overrides={"n_layer": 4, "n_embd": 64, "block_size": 32, "type_vocab_size": 2},
        batch_size=16,
        seq_len=32,
    ),
    "llama": dict(
        model="llama-tiny",
        model_overrides={
            "n_layer": 4,
            "n_embd": 64,
            "n_head": 4,
            "n_kv_head": 2,
            "block_size": 32,
        },
        batch_size=16,
        seq_len=32,
    ),
}


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("family,schedule", [("bert", "zb-v"), ("llama", "zb-h1")])
def test_bert_and_llama_train_the_same_under_zero_bubble(family, schedule):
    def cfg(parallel: ParallelConfig) -> TrainConfig:
        return TrainConfig.for_model(
            **FAMILIES[family],
            steps=3,
            eval_every=0,
            devices=8,
            optim=OptimConfig(lr=3e-3, warmup_steps=1),
            parallel=parallel,
        )

    want = losses(cfg(ParallelConfig(data=8)))
    v = _v(schedule)
    got = losses(
        cfg(ParallelConfig(pipe=2, data=4, pipeline=schedule, microbatches=4, virtual_stages=v))
    )
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.exhaustive
def test_3d_on_sixteen_devices_under_both_zero_bubble_schedules(tmp_path):
    from tests.test_pipeline_modes import _cli_losses

    base = _cli_losses(tmp_path, "base", "--devices", "8", "--mesh", "data=8")
    mesh = ("--devices", "16", "--mesh", "pipe=2,tensor=8", "--tensor-mode", "3d")
    for name, flags in (("zb-h1", ()), ("zb-v", ("--virtual-stages", "2"))):
        got = _cli_losses(tmp_path, name, *mesh, "--pipeline", name, *flags)
        np.testing.assert_allclose(got, base, rtol=1e-4, err_msg=name)
