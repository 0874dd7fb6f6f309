"""BERT and ViT train the same under other meshes as under data=8 (3 fp32 steps, in-process),
and the feature embedding (ViT's patches, BERT's token types) equals the one-device product in
every tensor mode, forward and gradients."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from colossal_jax.config import OptimConfig, ParallelConfig, TrainConfig
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout
from colossal_jax.tensor import features
from tests.helpers import losses

FAMILIES = {
    # token types on, so the 2D layout and the pipeline run BERT's segment embedding too
    "bert": dict(
        model="bert-tiny",
        model_overrides={"n_embd": 64, "block_size": 32, "type_vocab_size": 2},
        batch_size=16,
        seq_len=32,
    ),
    "vit": dict(model="vit-tiny", model_overrides={"n_layer": 2}, batch_size=16, seq_len=5),
}
MESHES = {
    # 1F1B over 2D SUMMA: the tied decoder, the segment embedding and the pipeline together
    "bert": ParallelConfig(pipe=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    # 3D: the one layout whose tokens and residual split the batch differently (features.py)
    "vit": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
}


def _config(family: str, parallel: ParallelConfig) -> TrainConfig:
    return TrainConfig.for_model(
        **FAMILIES[family],
        steps=3,
        eval_every=0,
        devices=8,
        optim=OptimConfig(lr=3e-3, warmup_steps=1),
        parallel=parallel,
    )


@pytest.mark.parametrize("family", list(MESHES))
def test_family_matches_data_parallel(family):
    want = losses(_config(family, ParallelConfig(data=8)))
    got = losses(_config(family, MESHES[family]))
    assert want[-1] < want[0]
    np.testing.assert_allclose(got, want, rtol=1e-4)


FEATURE_MODES = {
    "1d": ParallelConfig(data=2, tensor_row=4, tensor_mode="1d"),
    "2d": ParallelConfig(data=2, tensor_row=2, tensor_col=2, tensor_mode="2d"),
    "2.5d": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="2.5d"),
    "3d": ParallelConfig(tensor_row=2, tensor_col=2, tensor_depth=2, tensor_mode="3d"),
}


@pytest.mark.parametrize("mode", list(FEATURE_MODES))
def test_feature_embedding_matches_one_device(mode):
    cfg = FEATURE_MODES[mode]
    layout = make_layout(cfg, build_mesh(cfg, jax.devices()[: cfg.size]))
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (8, 4, 6))
    w = jax.random.normal(keys[1], (6, 16))
    b = jax.random.normal(keys[2], (16,))
    cot = jax.random.normal(keys[3], (8, 4, 16))

    def put(a, spec):
        return jax.device_put(a, NamedSharding(layout.mesh, spec))

    def scalar(x, w, b, embed):
        return jnp.sum(embed(x, w, b) * cot)

    def sharded(x, w, b):
        return features.embed_features(layout, x, w, b)

    args = (
        put(x, layout.token_spec()),
        put(w, features.weight_spec(layout)),
        put(b, features.bias_spec(layout)),
    )
    out = jax.jit(sharded)(*args)
    grads = jax.jit(jax.grad(functools.partial(scalar, embed=sharded), argnums=(0, 1, 2)))(*args)
    want_grads = jax.grad(
        functools.partial(scalar, embed=lambda x, w, b: x @ w + b), argnums=(0, 1, 2)
    )(x, w, b)
    np.testing.assert_allclose(out, x @ w + b, rtol=1e-5, atol=1e-5)
    for g, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
