"""Shared test helpers: a tiny training config and running it in-process."""

from __future__ import annotations

import dataclasses

from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig

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
