"""The loss and gradients of one unpipelined step, in one all-manual ``jax.shard_map``.

``sharded_value_and_grad`` returns ``f(params, batch, scale) -> (loss, grads)``: the mean loss
of the global batch and its gradients, with the contract of ``jax.value_and_grad`` of the plain
loss except that the gradients come in the ZeRO stage's shardings (split over ``data`` for
stages 2 and 3). Inside one ``shard_map`` over every mesh axis:

1. :func:`colossal_jax.parallel.zero.enter` makes every parameter vary over ``data``, so the kernels
   reduce their weight gradients only over their tensor/sequence axes;
2. the local batch block is cut into ``accum`` microbatches of consecutive rows and a
   ``lax.scan`` runs forward and backward of each, adding up the gradients (gradient
   accumulation, activation memory of one microbatch); stage 2 reduce-scatters each
   microbatch's gradient into a ``Ψ/N`` accumulator, stage 3 does so inside the backward pass;
3. :func:`colossal_jax.parallel.zero.reduce` is the one reduction over ``data``.

``scale`` multiplies the loss before differentiation (fp16 dynamic loss scaling); the loss
returned is unscaled, the gradients are not (the caller unscales and checks them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from colossal_jax.layers import use_parallelism
from colossal_jax.layers.stack import use_stack_options
from colossal_jax.parallel import zero
from colossal_jax.tensor.grid import axes_of
from colossal_jax.tensor.layout import LocalAttention, TensorLayout

Batch = dict[str, jax.Array]


def stack_layer_dims(graphdef: Any, abstract_params: Any, layout: TensorLayout) -> list:
    """Each stacked parameter's ZeRO dimension in the flattening order the stack's scan body
    sees (the state of ``model.blocks.layers``)."""
    layers = nnx.state(nnx.merge(graphdef, abstract_params).blocks.layers)
    return jax.tree.leaves(zero.zero_dims(layers, layout), is_leaf=lambda x: x is None)


def sharded_value_and_grad(
    graphdef: Any,
    layout: TensorLayout,
    local_attention: LocalAttention,
    *,
    param_specs: Any,
    grad_specs: Any,
    dims: Any,
    layer_dims: list,
    stage: int,
    accum: int = 1,
    remat: Callable[..., bool] | None = None,
    compute_dtype: Any = jnp.float32,
) -> Callable[[Any, Batch, jax.Array], tuple[jax.Array, Any]]:
    """``(params, batch, scale) -> (mean loss, grads)`` of the model ``graphdef``.

    Args:
      param_specs, grad_specs: PartitionSpec trees of the parameters as stored and of the
        gradients returned (the ZeRO stage's).
      dims, layer_dims: :func:`colossal_jax.parallel.zero.zero_dims` of the parameters and
        :func:`stack_layer_dims`.
      stage: ZeRO stage 0–3. accum: microbatches accumulated per step.
      remat: the stack's ``jax.checkpoint`` policy (``None``: none; ZeRO-3 without one still
        rematerialises each layer's gather, so no layer's gathered weights are kept).
    """
    mesh = layout.mesh
    tokens_spec = layout.token_spec()
    token_axes = tuple(a for entry in tokens_spec for a in axes_of(entry))
    options = zero.stack_options(stage, layer_dims, remat)
    extra = zero.extra_axes(param_specs, token_axes)

    def per_device(params, tokens, positions, targets, weights, scale):
        count = jnp.maximum(jax.lax.psum(jnp.sum(weights.astype(jnp.float32)), token_axes), 1.0)
        params = zero.enter(params, dims, stage, extra)

        def loss_of(p, mb):
            if compute_dtype != jnp.float32:
                p = jax.tree.map(lambda a: a.astype(compute_dtype), p)
            if stage == 3:
                p = zero.gather_rest(p, dims)
            with use_parallelism(layout, local_attention), use_stack_options(options):
                model = nnx.merge(graphdef, p)
                x = model.blocks(model.embed(mb["tokens"], mb["positions"]), mb["positions"])
                total, _ = model.head_loss(x, mb["targets"], mb["weights"])
            return total.astype(jnp.float32) / count * scale

        grad_fn = jax.value_and_grad(loss_of)
        batch = {"tokens": tokens, "positions": positions, "targets": targets, "weights": weights}
        if accum == 1:
            loss, grads = grad_fn(params, batch)
            grads = zero.reduce(grads, dims, stage, extra)
        else:
            micro = jax.tree.map(
                lambda a: a.reshape(accum, a.shape[0] // accum, *a.shape[1:]), batch
            )
            early = stage >= 2  # reduce each microbatch into a sharded accumulator

            def one(mb):
                loss, g = grad_fn(params, mb)
                return loss, (zero.reduce(g, dims, stage, extra) if early else g)

            def add(acc, mb):
                return jax.tree.map(jnp.add, acc, one(mb)), None

            first_loss, first = one(jax.tree.map(lambda a: a[0], micro))
            rest = jax.tree.map(lambda a: a[1:], micro)
            (loss, grads), _ = jax.lax.scan(add, (first_loss, first), rest)
            if not early:
                grads = zero.reduce(grads, dims, stage, extra)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        return loss / scale, grads

    def value_and_grad(params, batch, scale=None):
        scale = jnp.float32(1.0) if scale is None else scale.astype(jnp.float32)
        tok = tokens_spec
        return jax.shard_map(
            per_device,
            mesh=mesh,
            in_specs=(param_specs, tok, tok, tok, tok, P()),
            out_specs=(P(), grad_specs),
        )(params, batch["tokens"], batch["positions"], batch["targets"], batch["weights"], scale)

    return value_and_grad
