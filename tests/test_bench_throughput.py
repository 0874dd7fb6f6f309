"""The throughput harness's baseline computes what the library computes, and its JSON record.

- The plain-JAX GPT (``benchmarks/plain_jax_gpt.py``), given the library's parameters, has the
  library's loss on the same batch and the single-device gradients, in the Megatron 1D and the
  GSPMD 2D shardings the benchmark compares against (a baseline that computed something else
  would make every ratio meaningless).
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import plain_jax_gpt as pj
from tests.helpers import tiny_config

T = importlib.import_module("colossal_jax.train")

CASES = {  # library mesh (ParallelConfig fields) -> plain mode and mesh (data, row, col)
    "1d": ({"tensor_row": 8, "tensor_mode": "1d"}, "1d", (1, 8, 1)),
    "2d": ({"data": 2, "tensor_row": 2, "tensor_col": 2, "tensor_mode": "2d"}, "2d", (2, 2, 2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plain_jax_loss_and_gradients_match_library(case):
    parallel, mode, dims = CASES[case]
    cfg = tiny_config(steps=2, batch_size=8, seq_len=16, **parallel)
    run = T.build(cfg)
    params, _ = T.init_state(run)
    host = run.batches.batch(0)
    library_loss = float(T.make_eval_step(run)(params, T.global_batch(run, 0)))

    mesh = pj.make_mesh(mode, *dims)
    plain = pj.build(run.model, run.tx, mesh, mode)
    plain_params, _ = plain.place(pj.from_library(params))
    batch = plain.put_batch(host)
    plain_loss, grads = plain.value_and_grad(plain_params, batch)
    assert float(plain_loss) == pytest.approx(library_loss, rel=1e-6, abs=1e-6)

    # the sharded program's gradients are the single-device ones (GSPMD chose every collective)
    whole = jax.device_get(plain_params)
    ref = jax.grad(pj.loss_fn)(whole, host, run.model)
    worst = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True)
    )
    scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(ref))
    assert worst <= 1e-5 * scale, f"{case}: gradient differs by {worst} (largest {scale})"
    assert np.isfinite(scale) and scale > 0
