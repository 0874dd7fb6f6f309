"""Mesh-shape invariance of the whole GPT: every tensor and sequence mode, alone and combined
with data parallelism, gives the data-parallel loss curve (fp32, 10 steps, 1e-4 relative)."""

import dataclasses

import numpy as np
import pytest

from tests.helpers import losses, tiny_config

STEPS = 10
MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 8, "block_size": 64}


def _cfg(**parallel):
    cfg = tiny_config(steps=STEPS, batch_size=8, seq_len=32, devices=8, **parallel)
    # no held-out loss: not compared here (an evaluation step less to compile per case)
    return dataclasses.replace(cfg, model_overrides=dict(MODEL), eval_every=0)


@pytest.fixture(scope="module")
def data_parallel_losses():
    return losses(_cfg(data=8))


TENSOR = {
    "1d-t8": dict(data=1, tensor_row=8, tensor_mode="1d"),
    "1d-t4-data2": dict(data=2, tensor_row=4, tensor_mode="1d"),
    "2d-q2-data2": dict(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d-q2-d2": dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d-q2": dict(data=1, tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
    "2d-q2-data2-zero1": dict(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d", zero=1),
}

SEQUENCE = {
    f"{mode}-{name}": dict(seq_mode=mode, **par)
    for mode in ("ring", "ulysses")
    for name, par in {
        "seq8": dict(data=1, seq=8),
        "data2-seq4": dict(data=2, seq=4),
        "seq2-1d-t4": dict(data=1, seq=2, tensor_row=4, tensor_mode="1d"),
    }.items()
}
SEQUENCE["ring-self-attention-data2-seq4"] = dict(seq_mode="ring-self-attention", data=2, seq=4)


@pytest.mark.parametrize("name", list(TENSOR))
def test_tensor_modes_match_data_parallel(name, data_parallel_losses):
    got = losses(_cfg(**TENSOR[name]))
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)


@pytest.mark.parametrize("name", list(SEQUENCE))
def test_sequence_modes_match_data_parallel(name, data_parallel_losses):
    got = losses(_cfg(**SEQUENCE[name]))
    np.testing.assert_allclose(got, data_parallel_losses, rtol=1e-4)
