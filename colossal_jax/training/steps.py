"""The jitted functions a run executes: the train step ``(params, opt_state, batch) -> (params,
opt_state, metrics)`` (fp16: with dynamic loss scaling) and the eval step ``(params, batch) ->
metrics``, both in the run's shardings; offloaded state is brought to the device inside them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.layers import use_parallelism
from colossal_jax.parallel.step import sharded_value_and_grad
from colossal_jax.pipeline.chunk_order import exchange_stacked
from colossal_jax.training.batches import stop_sharding
from colossal_jax.training.run import Run
from colossal_jax.training.stack_order import chunk_ordered

COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
"""The dtype the forward and backward compute in, by ``--precision`` (parameters stay fp32)."""

BATCH_KEYS = ("tokens", "targets", "positions", "weights")
"""The arrays of a model's batch (a training batch adds ``stop``)."""


def make_train_step(run: Run) -> Callable:
    """The jitted step ``(params, opt_state, batch) -> (params, opt_state, metrics)``."""
    value_and_grad = value_and_grad_fn(run)
    if run.cfg.precision == "fp16":
        return _jit_step(run, _loss_scaled_step(run, value_and_grad))

    def step(params, opt_state, batch):
        batch, stop = _split_stop(batch)
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        opt_state = to_device(opt_state, run.device_opt_shardings, run.opt_shardings)
        loss, grads = value_and_grad(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = run.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": grad_norm, "stop": stop}

    return _jit_step(run, step)


def _loss_scaled_step(run: Run, value_and_grad: Callable) -> Callable:
    """fp16: scale the loss, unscale and check the gradients, skip a non-finite step (parameters
    and optimizer state unchanged, scale halved), grow the scale after clean steps."""
    from colossal_jax.training import loss_scale as ls

    def step(params, opt_state, batch):
        batch, stop = _split_stop(batch)
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        opt_state = to_device(opt_state, run.device_opt_shardings, run.opt_shardings)
        scale_state = opt_state.loss_scale
        loss, grads = value_and_grad(params, batch, scale_state.scale)
        grads, finite = ls.unscale_and_check(scale_state, grads)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = run.tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = ls.select_if_finite(finite, (new_params, new_opt), (params, opt_state))
        new_scale = ls.update_scale(scale_state, finite)
        opt_state = opt_state._replace(loss_scale=new_scale)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "loss_scale": scale_state.scale,
            "skipped_steps": new_scale.skipped,
            "stop": stop,
        }
        return params, opt_state, metrics

    return step


def _jit_step(run: Run, step: Callable) -> Callable:
    """``step`` jitted in the run's shardings, parameters and optimizer state donated."""
    batch_shardings = {k: run.batch_sharding for k in BATCH_KEYS}
    batch_shardings["stop"] = stop_sharding(run.mesh)
    return jax.jit(
        step,
        in_shardings=(run.param_shardings, run.opt_shardings, batch_shardings),
        out_shardings=(run.param_shardings, run.opt_shardings, None),
        donate_argnums=(0, 1),
    )


def _split_stop(batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], jax.Array]:
    """``(the model's batch, the largest stop flag of any process)`` — see
    :func:`colossal_jax.training.batches.stop_flags`."""
    batch = dict(batch)
    return batch, jnp.max(batch.pop("stop"))


def to_device(tree: Any, device_shardings: Any, shardings: Any) -> Any:
    """Inside a jitted step: bring host-resident (offloaded) state to device memory; a no-op for
    state that already lives there."""
    if device_shardings is shardings:
        return tree
    return jax.device_put(tree, device_shardings)


def value_and_grad_fn(run: Run) -> Callable:
    """``(params, batch, scale) -> (loss, grads)``: the all-manual step with ZeRO and gradient
    accumulation (:mod:`colossal_jax.parallel.step`), or the pipeline executor. ``scale``
    multiplies the loss before differentiation (fp16 loss scaling); the gradients come back
    scaled."""
    from colossal_jax.parallel.remat import RematPolicy

    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]
    if run.schedule is None:
        return sharded_value_and_grad(
            run.graphdef,
            run.layout,
            run.local_attention,
            param_specs=_specs(run.param_shardings),
            grad_specs=_specs(run.grad_shardings),
            dims=run.zero_dims,
            layer_dims=run.layer_dims,
            stage=run.cfg.parallel.zero,
            accum=run.plan.grad_accum,
            remat=RematPolicy(run.cfg.remat).policy(),
            compute_dtype=compute_dtype,
        )
    from colossal_jax.pipeline.step import pipelined_value_and_grad

    return pipelined_value_and_grad(
        run.graphdef,
        run.schedule,
        run.layout,
        run.local_attention,
        compute_dtype=compute_dtype,
        stage=run.cfg.parallel.zero,
        layer_dims=run.layer_dims,
        remat=RematPolicy(run.cfg.remat).policy(),
    )


def _specs(shardings: Any) -> Any:
    return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def make_eval_step(run: Run, *, stored: bool = False) -> Callable:
    """The jitted forward ``(params, batch) -> metrics``, in the training step's shardings:
    ``loss`` (the batch's mean weighted loss), ``count`` (its sum of weights) and, for image
    classification, ``correct`` (the weight of the examples whose class logit is the largest).
    ``params`` are in model order, or with ``stored`` in the order the run keeps them between
    steps (chunk order for ``V > 1`` chunks per stage, :mod:`colossal_jax.training.stack_order`);
    the order the pipelined loss or the plain forward needs is made inside.

    A pipelined run evaluates its loss through the same pipelined function as training and
    drops the gradients (its stacked parameters stay split over ``pipe``); its accuracy comes
    from a plain forward, for which XLA gathers the stack over ``pipe``."""
    if run.schedule is None:
        loss_fn = _loss_fn(run)
    else:
        value_and_grad = value_and_grad_fn(run)

        def loss_fn(params, batch):
            return value_and_grad(params, batch)[0]

    accuracy = run.task == "image_classification"
    ordered = chunk_ordered(run)

    def on_device_metrics(params, batch):
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        chunks = model = params
        if ordered:  # the other order, made here (an unused one is compiled away)
            other = exchange_stacked(
                params, run.device_param_shardings, run.schedule, to_chunks=not stored
            )
            chunks, model = (params, other) if stored else (other, params)
        out = {"loss": loss_fn(chunks, batch), "count": jnp.sum(batch["weights"])}
        if accuracy:
            out["correct"] = _correct(run, model, batch)
        return out

    batch_shardings = {k: run.batch_sharding for k in BATCH_KEYS}
    return jax.jit(on_device_metrics, in_shardings=(run.param_shardings, batch_shardings))


def _loss_fn(run: Run) -> Callable:
    """The unpipelined mean loss ``(params, batch) -> loss`` (compute dtype cast inside)."""
    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]

    def loss_fn(params, batch):
        if compute_dtype != jnp.float32:
            params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
        with use_parallelism(run.layout, run.local_attention):
            model = nnx.merge(run.graphdef, params)
            return model.loss(
                batch["tokens"], batch["positions"], batch["targets"], batch["weights"]
            )

    return loss_fn


def _correct(run: Run, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """``Σ weight · [argmax over the real classes == target]`` of a forward pass."""
    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]
    if compute_dtype != jnp.float32:
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    tokens, positions = batch["tokens"], batch["positions"]
    with use_parallelism(run.layout, run.local_attention):
        model = nnx.merge(run.graphdef, params)
        logits = model.logits(model.blocks(model.embed(tokens, positions), positions))
    classes = getattr(run.model, "num_classes", logits.shape[-1])
    hit = jnp.argmax(logits[..., :classes], axis=-1) == batch["targets"]
    return jnp.sum(batch["weights"] * hit.astype(jnp.float32))
