"""The extension points are real: a tensor mode, an optimizer and a sequence mode registered from
this file, without editing the library, train through ``colossal_jax.train`` to the same losses
as the built-in one they copy, and a registered pipeline schedule builds the same table as its
original; the choice lists see them while they are registered and forget them after."""

from __future__ import annotations

import dataclasses

import numpy as np
import optax
import pytest

import colossal_jax as cj
from colossal_jax.checks.resolve import resolve
from colossal_jax.config import (
    ConfigError,
    OptimConfig,
    optimizers,
    pipelines,
    seq_modes,
    tensor_modes,
)
from colossal_jax.config.choices import OPTIMIZERS, PIPELINES, SEQ_MODES, TENSOR_MODES
from tests.helpers import tiny_config

STEPS = 3


def _losses(cfg: cj.TrainConfig) -> list[float]:
    return cj.train(cfg, progress=False, log=lambda _: None).losses


def _same(a: list[float], b: list[float]) -> None:
    """Bit-identical loss sequences: the registered object runs the very same program."""
    assert len(a) == len(b) == STEPS
    assert a == b


@pytest.fixture
def megatron():
    """1D tensor parallelism under another name: its grid rules (``OneD``) and its layout class,
    given as the class itself rather than a reference."""
    from colossal_jax.tensor.one_d import OneDLayout

    mode = tensor_modes.register(
        tensor_modes.OneD("megatron", "Megatron-LM's split, registered by a test", OneDLayout)
    )
    yield mode.name
    tensor_modes.unregister(mode.name)


@pytest.fixture
def adamw_again():
    """AdamW under another name, its transform written here."""
    from colossal_jax.training.optim import matrix_mask

    def transform(cfg: OptimConfig, lr: optax.Schedule) -> list[optax.GradientTransformation]:
        return [
            optax.adamw(
                lr,
                b1=cfg.b1,
                b2=cfg.b2,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
                mask=matrix_mask,
            )
        ]

    opt = optimizers.register(
        optimizers.Optimizer("adamw-again", "AdamW, registered by a test", transform, slots=2)
    )
    yield opt.name
    optimizers.unregister(opt.name)


@pytest.fixture
def gpipe_again():
    """GPipe's order under another name (a ``"package.module:Name"`` reference)."""
    schedule = pipelines.register(
        dataclasses.replace(pipelines.pipeline_schedule("gpipe"), name="gpipe-again")
    )
    yield schedule.name
    pipelines.unregister(schedule.name)


@pytest.fixture
def ring_again():
    """Ring attention under another name, with ring's properties (zigzag for a causal model)."""
    mode = seq_modes.register(dataclasses.replace(seq_modes.seq_mode("ring"), name="ring-again"))
    yield mode.name
    seq_modes.unregister(mode.name)


def test_a_registered_tensor_mode_trains_like_the_one_it_copies(megatron):
    assert megatron in TENSOR_MODES and megatron in ", ".join(TENSOR_MODES)
    assert cj.parse_mesh("tensor=4", 8, tensor_mode=megatron) == {"tensor_row": 4, "data": 2}
    cfg = tiny_config(steps=STEPS, tensor_row=4, data=2, tensor_mode=megatron)
    two_heads = dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, "n_head": 2})
    with pytest.raises(ConfigError, match="megatron tensor parallelism over 4 devices needs heads"):
        resolve(two_heads, 8)
    _same(_losses(cfg), _losses(tiny_config(steps=STEPS, tensor_row=4, data=2, tensor_mode="1d")))


def test_a_registered_optimizer_trains_like_the_one_it_copies(adamw_again):
    assert adamw_again in OPTIMIZERS
    base = tiny_config(steps=STEPS, data=8)
    again = dataclasses.replace(base, optim=dataclasses.replace(base.optim, name=adamw_again))
    _same(_losses(again), _losses(base))


def test_a_registered_schedule_is_accepted_and_builds_the_same_table(gpipe_again):
    """Training reads a schedule only through its table (``pipeline.schedule.build``), so the
    same table is the same run."""
    from colossal_jax.pipeline.schedule import SCHEDULES, build

    assert gpipe_again in PIPELINES and gpipe_again in SCHEDULES
    cfg = tiny_config(steps=STEPS, pipe=2, data=4, microbatches=2, pipeline=gpipe_again)
    assert resolve(cfg, 8).pipeline == gpipe_again
    np.testing.assert_array_equal(build(gpipe_again, 2, 4).table, build("gpipe", 2, 4).table)
    with pytest.raises(ConfigError, match=r"--virtual-stages 2 needs --pipeline interleaved"):
        dataclasses.replace(cfg.parallel, virtual_stages=2).validate()


def test_a_registered_sequence_mode_trains_like_the_one_it_copies(ring_again):
    assert ring_again in SEQ_MODES
    new = _losses(tiny_config(steps=STEPS, seq=2, data=4, seq_mode=ring_again))
    _same(new, _losses(tiny_config(steps=STEPS, seq=2, data=4, seq_mode="ring")))


def test_an_unregistered_name_is_refused_naming_the_registered_ones():
    assert "megatron" not in TENSOR_MODES
    with pytest.raises(ConfigError, match=r"--tensor-mode 'megatron' is not one of none, 1d"):
        cj.ParallelConfig(tensor_row=4, data=2, tensor_mode="megatron").validate()
    with pytest.raises(ValueError, match="registered twice"):
        tensor_modes.register(tensor_modes.tensor_mode("1d"))
