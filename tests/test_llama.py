"""LLaMA: the published sizes, its configuration rules, and llama-tiny's loss and gradients (tied
embeddings, a padded row) through the training step's program on a 2D tensor grid × zigzag ring
attention, against one device."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.config import ConfigError, ParallelConfig, TrainConfig
from colossal_jax.config.model_rules import check_run
from colossal_jax.config.parallel_rules import uses_zigzag
from colossal_jax.layers import use_parallelism
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.parallel.step import sharded_value_and_grad, stack_layer_dims
from colossal_jax.parallel.zero import zero_dims
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.sequence.zigzag import zigzag_permutation
from colossal_jax.tensor.replicated import ReplicatedLayout
from colossal_jax_models.llama import Llama
from colossal_jax_models.llama_config import LLAMA_MODELS, llama_config

# Hugging Face's parameter counts of the released checkpoints
PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_sizes(name):
    cfg = LLAMA_MODELS[name]
    assert cfg.param_count() == PUBLISHED[name]
    assert cfg.mlp_width == cfg.intermediate_size
    n = cfg.matmul_params()
    assert cfg.flops_per_token(4096) == 6 * n + 12 * cfg.n_layer * 4096 * cfg.n_embd


def test_llama_tiny_counts_its_own_parameters():
    for tie in (False, True):
        cfg = llama_config("llama-tiny", tie_embeddings=tie)
        model = nnx.eval_shape(lambda cfg=cfg: Llama(cfg, rngs=nnx.Rngs(0)))
        state = nnx.state(model, nnx.Param)
        assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state)) == cfg.param_count()


def test_config_errors():
    with pytest.raises(ValueError, match=r"n_kv_head=3 does not divide model.n_head=16"):
        llama_config("llama-tiny", n_kv_head=3)
    with pytest.raises(KeyError, match="llama-tiny"):
        llama_config("llama-huge")
    tiny = dataclasses.replace(LLAMA_MODELS["llama-tiny"], n_head=8, n_kv_head=4)
    cfg = TrainConfig(
        batch_size=8, seq_len=32, parallel=ParallelConfig(tensor_row=8, tensor_mode="1d")
    )
    with pytest.raises(
        ConfigError, match=r"kv_heads=4 is not divisible by 8.*tensor ∈ \{1, 2, 4\}"
    ):
        check_run(cfg, tiny)
    check_run(
        dataclasses.replace(cfg, parallel=ParallelConfig(data=2, tensor_row=4, tensor_mode="1d")),
        tiny,
    )
    # llama is causal: a ring keeps zigzag order (2·seq chunks)
    assert uses_zigzag(ParallelConfig(seq=4, seq_mode="ring"), tiny)


B, S = 8, 16


def _batch():
    tokens = jax.random.randint(jax.random.key(0), (B, S + 1), 0, 256)
    pos = np.tile(np.arange(S), (B, 1))
    pos[3, S - 4 :] = -1  # a right-padded row: padding masked as keys and weighted 0
    weights = jnp.asarray(pos >= 0, jnp.float32)
    return tokens[:, :-1], jnp.asarray(pos, jnp.int32), tokens[:, 1:], weights


def _loss_and_grads(cfg, layout, local, order=None):
    """One device: ``jax.value_and_grad`` of ``Llama.loss``. A mesh: the training step's program
    (:func:`colossal_jax.parallel.step.sharded_value_and_grad`, every mesh axis manual)."""
    # a scan over the layers, as deeper models run (one layer body to compile)
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0), unroll=False))
    batch = dict(zip(("tokens", "positions", "targets", "weights"), _batch(), strict=True))
    if order is not None:
        batch = {k: a[:, order] for k, a in batch.items()}
    if layout.mesh.size == 1:

        def loss(params):
            with use_parallelism(layout, local):
                return nnx.merge(graphdef, params).loss(**batch)

        return jax.jit(jax.value_and_grad(loss))(params)
    shardings = tree_shardings(params, layout)
    specs = jax.tree.map(
        lambda s: s.spec, shardings, is_leaf=lambda x: isinstance(x, NamedSharding)
    )
    step = sharded_value_and_grad(
        graphdef,
        layout,
        local,
        param_specs=specs,
        grad_specs=specs,
        dims=zero_dims(params, layout),
        layer_dims=stack_layer_dims(graphdef, params, layout),
        stage=0,
    )
    params = jax.device_put(params, shardings)
    batch = jax.device_put(batch, NamedSharding(layout.mesh, layout.token_spec()))
    return jax.jit(step)(params, batch)


@functools.cache
def _reference(tie: bool):
    layout = ReplicatedLayout(build_mesh(ParallelConfig(), jax.devices()[:1]))
    cfg = llama_config("llama-tiny", tie_embeddings=tie)
    return _loss_and_grads(cfg, layout, dot_product_attention)


@pytest.mark.parametrize(
    "par,tie",
    [
        (
            ParallelConfig(tensor_row=2, tensor_col=2, tensor_mode="2d", seq=2, seq_mode="ring"),
            True,
        ),
    ],
    ids=["2d-q2-ring2-zigzag-tied"],
)
def test_llama_tiny_loss_and_grads_match_one_device(par, tie):
    cfg = llama_config("llama-tiny", tie_embeddings=tie)
    layout = make_layout(par, build_mesh(par, jax.devices()[: par.size]))
    layout.validate(
        hidden=cfg.n_embd, mlp=cfg.mlp_width, heads=cfg.n_head, vocab=cfg.vocab_size,
        kv_heads=cfg.n_kv_head,
    )  # fmt: skip
    order = zigzag_permutation(S, par.seq) if uses_zigzag(par, cfg) else None
    local = make_local_attention(par, implementation="xla")
    loss, grads = _loss_and_grads(cfg, layout, local, order)
    want_loss, want_grads = _reference(tie)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    flat = jax.tree.leaves_with_path(grads)
    for (path, g), w in zip(flat, jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
