"""The pipelined loss and gradients of one step: the model's three parts handed to the executor.

``pipelined_value_and_grad`` returns ``f(params, batch, scale=None) -> (loss, grads)`` with the
same contract as ``jax.value_and_grad`` of the unpipelined loss (gradients multiplied by
``scale``, for fp16 loss scaling). Inside it:

1. the model's parameters are split by the ``layer_axis`` metadata into the stack (leading layer
   dimension, split over ``pipe``) and the rest (embedding, final norm, head). The rest is
   stored split over ``pipe`` as well (each stage keeps ``1/p`` of it and of its optimizer
   state): the step all-gathers it over ``pipe`` on entry and reduce-scatters its gradient over
   ``pipe`` at the end — the same bytes as the all-reduce a replicated copy would need, ``2·(p −
   1)/p`` of the rest per device;
2. for the schedules with several chunks per stage the stack comes **in chunk order** — each
   stage's contiguous block of the layer axis holds the chunks it runs (interleaved: ``s, s+p,
   …``; ZB-V: ``s`` and ``2p − 1 − s``), as such a run stores it between steps
   (:mod:`colossal_jax.pipeline.chunk_order`) — and its gradient leaves in chunk order: the step
   moves no parameter between stages;
3. one ``jax.shard_map`` over every mesh axis runs :func:`~colossal_jax.pipeline.executor.
   run_pipeline` with the layouts' kernels working on per-device blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from colossal_jax.layers import stacked_filter, use_parallelism
from colossal_jax.layers.stack import StackOptions, use_stack_options
from colossal_jax.parallel import zero
from colossal_jax.parallel.sharding import param_specs, rest_axis_dims
from colossal_jax.pipeline.executor import PIPE, run_pipeline
from colossal_jax.pipeline.schedule import Schedule
from colossal_jax.tensor.grid import axes_of
from colossal_jax.tensor.layout import LocalAttention, TensorLayout


@dataclass(frozen=True)
class _PipelineParams:
    """A model's parameters split for the pipeline, with the specs each part enters and leaves
    the step's ``shard_map`` in.

    Attributes:
      graphdef: the graph both parts merge back into.
      stack, rest: the stacked blocks (leading layer dimension, split over ``pipe``) and the
        other parameters (embedding, final norm, head; stored split over ``pipe`` too where a
        dimension divides, gathered whole on every stage for the step).
      stack_specs, rest_specs: their layout specs; ``stack_zero``, ``rest_zero``: the same with
        ZeRO's ``data`` split; ``stack_dims``, ``rest_dims``: each parameter's ZeRO dimension.
    """

    graphdef: Any
    stack: Any
    rest: Any
    stack_specs: Any
    rest_specs: Any
    stack_zero: Any
    rest_zero: Any
    stack_dims: Any
    rest_dims: Any

    @classmethod
    def split(cls, graphdef: Any, params: Any, layout: TensorLayout) -> _PipelineParams:
        gd, stack, rest = nnx.split(nnx.merge(graphdef, params), stacked_filter, ...)
        return cls(
            gd,
            stack,
            rest,
            param_specs(stack, layout, layer_entry=PIPE),
            param_specs(rest, layout, rest_axis=PIPE),
            param_specs(stack, layout, layer_entry=PIPE, zero_axis=zero.AXIS),
            param_specs(rest, layout, zero_axis=zero.AXIS, rest_axis=PIPE),
            zero.zero_dims(stack, layout, layer_entry="pipe"),
            zero.zero_dims(rest, layout),
        )

    def specs(self, zero_sharded: bool) -> tuple[Any, Any]:
        """``(stack, rest)`` specs, with ZeRO's ``data`` split when ``zero_sharded``."""
        if zero_sharded:
            return self.stack_zero, self.rest_zero
        return self.stack_specs, self.rest_specs


def _per_device_step(
    parts: _PipelineParams,
    schedule: Schedule,
    layout: TensorLayout,
    local_attention: LocalAttention,
    options: StackOptions,
    stage: int,
    token_axes: tuple[str, ...],
) -> Callable:
    """The body of the step's all-manual ``shard_map``: ``(stack, rest, tokens, positions,
    targets, weights, scale) -> (loss, d_stack, d_rest)`` — the parameters entered into ZeRO
    ``stage``, :func:`run_pipeline` with the layouts' kernels, one ZeRO reduction at the end."""
    gd, stack_dims, rest_dims = parts.graphdef, parts.stack_dims, parts.rest_dims
    rest_in = rest_axis_dims(parts.specs(stage == 3)[1], PIPE)
    rest_out = rest_axis_dims(parts.specs(stage >= 2)[1], PIPE)
    # the token axes beside data (seq, a grid's batch axes) that split the tokens but not a
    # parameter: entered varying over them once, so no tick's vjp reduces a chunk's gradient
    # over them; the one reduction at the end sums over them with data
    stack_extra = zero.extra_axes(parts.stack_specs, token_axes)
    rest_extra = zero.extra_axes(parts.rest_specs, token_axes)

    def per_device(stack, rest, tokens, positions, targets, weights, scale):
        rest = _over_pipe(rest, rest_in, gather=True)
        stack = zero.enter(stack, stack_dims, stage, stack_extra)
        rest = zero.enter(rest, rest_dims, stage, rest_extra)
        if stage == 3:  # the unstacked parameters whole; their gradient is scattered below
            rest = zero.gather_rest(rest, rest_dims)

        def chunk_fn(chunk, x, pos):
            return nnx.merge(gd, chunk, rest).blocks(x, pos)

        def embed_fn(r, tok, pos):
            return nnx.merge(gd, stack, r).embed(tok, pos)

        def head_fn(r, y, tgt, w):
            return nnx.merge(gd, stack, r).head_loss(y, tgt, w)

        with use_parallelism(layout, local_attention), use_stack_options(options):
            loss, d_stack, d_rest = run_pipeline(
                schedule,
                chunk_fn=chunk_fn,
                embed_fn=embed_fn,
                head_fn=head_fn,
                stack=stack,
                rest=rest,
                tokens=tokens,
                positions=positions,
                targets=targets,
                weights=weights,
                token_axes=token_axes,
                scale=scale,
            )
        d_stack = zero.reduce(d_stack, stack_dims, stage, stack_extra)
        d_rest = zero.reduce(d_rest, rest_dims, 2 if stage == 3 else stage, rest_extra)
        d_rest = _over_pipe(d_rest, rest_out, gather=False)
        return loss, d_stack, d_rest

    return per_device


def _over_pipe(tree: Any, dims: Any, *, gather: bool) -> Any:
    """The unstacked parameters gathered whole over ``pipe`` from their stored split
    (``gather``), or their gradients — each stage's partial sum — reduce-scattered back to it
    (summed whole where no dimension splits)."""

    def one(a, d, _):
        if gather:
            return a if d is None else jax.lax.all_gather(a, PIPE, axis=d, tiled=True)
        if d is None:
            return jax.lax.psum(a, PIPE)
        return jax.lax.psum_scatter(a, PIPE, scatter_dimension=d, tiled=True)

    return zero.map_dims(one, tree, dims)


def pipelined_value_and_grad(
    graphdef: Any,
    schedule: Schedule,
    layout: TensorLayout,
    local_attention: LocalAttention,
    *,
    compute_dtype: Any = jnp.float32,
    stage: int = 0,
    layer_dims: list | None = None,
    remat: Callable[..., bool] | None = None,
) -> Callable[[Any, dict[str, jax.Array]], tuple[jax.Array, Any]]:
    """``(params, batch) -> (mean loss, grads)`` through the pipeline ``schedule``; with
    ``V > 1`` chunks per stage ``params`` and the gradients are in chunk order
    (:mod:`colossal_jax.pipeline.chunk_order`).

    ``stage`` is the ZeRO stage over ``data`` (:mod:`colossal_jax.parallel.zero`: the parameters
    enter varying over ``data`` and one reduction at the end covers every gradient; stage 3
    stores the parameters sharded and gathers each layer inside the chunks, with ``layer_dims``
    from :func:`colossal_jax.parallel.step.stack_layer_dims`). ``remat`` is the stack's
    checkpoint policy: a chunk's forward then keeps only what the policy saves until its
    backward."""
    token_spec = layout.token_spec()
    token_axes = tuple(a for entry in token_spec for a in axes_of(entry))
    options = zero.stack_options(stage, layer_dims, remat)

    def value_and_grad(params, batch, scale=None):
        model_params = params
        if compute_dtype != jnp.float32:
            params = jax.tree.map(lambda a: a.astype(compute_dtype), params)
        parts = _PipelineParams.split(graphdef, params, layout)
        per_device = _per_device_step(
            parts, schedule, layout, local_attention, options, stage, token_axes
        )
        tok = token_spec
        loss, d_stack, d_rest = jax.shard_map(
            per_device,
            mesh=layout.mesh,
            in_specs=(*parts.specs(stage == 3), tok, tok, tok, tok, P()),
            out_specs=(P(), *parts.specs(stage >= 2)),
        )(
            parts.stack,
            parts.rest,
            batch["tokens"],
            batch["positions"],
            batch["targets"],
            batch["weights"],
            jnp.float32(1.0) if scale is None else scale.astype(jnp.float32),
        )
        grads = nnx.merge_state(d_stack, d_rest)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, model_params)
        return loss, grads

    return value_and_grad
