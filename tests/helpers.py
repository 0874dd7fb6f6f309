"""Shared test helpers: a tiny training config and running it in-process."""

from __future__ import annotations

import dataclasses
import os

from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

LEVEL0 = "--xla_backend_optimization_level=0"
"""conftest's XLA optimisation level, which the scripts the tests start compile at too."""


def script_env() -> dict[str, str]:
    """The environment of a script a test starts: CPU, conftest's optimisation level kept and
    its device count left out (the script's ``--devices`` sets it), so every run a test
    compares is compiled alike, each compile at about 2/3 of the CPU time."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=LEVEL0)


TINY_MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64}


def tiny_config(
    steps: int = 10, batch_size: int = 8, seq_len: int = 32, devices: int = 8, **parallel
) -> TrainConfig:
    """gpt2-tiny shrunk further, on the embedded corpus, fp32."""
    data = parallel.pop("data", None)
    par = ParallelConfig(**parallel)
    if data is None:
        data = devices // (par.size // par.data)
    par = dataclasses.replace(par, data=data)
    return TrainConfig(
        model="gpt2-tiny",
        model_overrides=dict(TINY_MODEL),
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        devices=devices,
        optim=OptimConfig(lr=3e-3, warmup_steps=3),
        parallel=par,
    )


def losses(cfg: TrainConfig) -> list[float]:
    from colossal_jax.training.trainer import train

    return train(cfg, progress=False, log=lambda _: None).losses


def assert_pipelined_gradients_equal_plain(cfg: TrainConfig) -> None:
    """One step of ``cfg``'s pipeline schedule gives the loss (1e-6) and gradients (1e-5) of
    the same model run unpipelined on the same batch."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from colossal_jax.layers import use_parallelism
    from colossal_jax.pipeline.step import pipelined_value_and_grad
    from colossal_jax.training.batches import global_batch
    from colossal_jax.training.run import build as build_run
    from colossal_jax.training.run import init_state
    from colossal_jax.training.stack_order import to_model, to_stored

    run = build_run(cfg)
    params, _ = init_state(run)
    batch = global_batch(run, 0)

    def plain(params, b):
        with use_parallelism(run.layout, run.local_attention):
            model = nnx.merge(run.graphdef, params)
            return model.loss(b["tokens"], b["positions"], b["targets"], b["weights"])

    want_loss, want = jax.jit(jax.value_and_grad(plain))(params, batch)
    pipelined = pipelined_value_and_grad(
        run.graphdef, run.schedule, run.layout, run.local_attention
    )
    # the step takes the state as the run stores it (chunk order for V > 1) and gives the
    # gradient in that order
    stored, _ = to_stored(run, jax.tree.map(jnp.copy, params), None)
    got_loss, got = jax.jit(pipelined)(stored, batch)
    got, _ = to_model(run, got)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
