"""One SPMD executor for any pipeline tick table: the loss and every gradient of a training step.

Algorithm. The model is ``embed → stack → head``; the stack's layers are split into ``p·V``
chunks of consecutive layers, chunk ``c`` on stage ``c mod p`` of the ``pipe`` axis. The whole
step runs in one ``jax.shard_map`` in which *every* mesh axis is manual, so each device branches
on its own: a ``lax.scan`` over the ticks of :class:`~colossal_jax.pipeline.schedule.Schedule`,
and at each tick a ``lax.switch`` on this stage's entry:

- **forward** of microbatch ``m``, chunk ``v``: the input is the embedding of ``m`` (first chunk)
  or the activation received earlier; ``jax.vjp`` of the chunk gives the output and the
  backward's residuals, which are stored in a residual slot until the backward. The last chunk
  also runs the loss head and its ``vjp`` at once, so its gradient waits in a gradient slot.
- **backward**: the residuals are taken from their slot and the ``vjp`` applied to the gradient
  received from the next stage; parameter gradients accumulate; the first chunk also runs the
  embedding's backward.
- **idle**: nothing (a bubble tick costs no compute; it still sends its zero-filled messages).

After the switch, one ``ppermute`` over ``pipe`` sends the forward output to stage ``s+1`` and
one sends the input gradient to stage ``s−1`` (rings, so interleaved chunks wrap from the last
stage to the first); the receiver files them into the slots the table names. The tensor and
sequence kernels inside a chunk run unchanged: in the all-manual region the layouts call their
per-device bodies directly (:func:`colossal_jax.tensor.layout.sharded`).

Cost per device and tick: one chunk forward or backward (or nothing), and two ppermutes of one
microbatch's activation ``mb·s·h`` (forward and backward), whether or not a message is due.
Memory: ``slots["residual"]`` chunk-residual sets (``M`` for GPipe, ``p`` for 1F1B) plus the
activation and gradient inboxes. The embedding and the head's parameters live on every stage;
their gradients are summed over ``pipe`` once per step (only the first/last stage's are nonzero).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from colossal_jax.pipeline.schedule import BRANCHES, COL, Schedule
from colossal_jax.tensor.kernels import varying, varying_axes_of
from colossal_jax.tensor.layout import per_stage_branches

PIPE = "pipe"

ChunkFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
"""``chunk(chunk_params, x, positions) -> y`` for a chunk of consecutive stack layers."""
EmbedFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
"""``embed(rest_params, tokens, positions) -> x``."""
HeadFn = Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
"""``head(rest_params, y, targets, weights) -> (Σ weighted loss, Σ weights)``, reduced over the
token axes (replicated within the stage)."""


def _zeros(shape: tuple[int, ...], like) -> jax.Array:
    """Zeros of ``shape`` with the dtype of ``like``, varying over the same mesh axes."""
    return varying(jnp.zeros(shape, like.dtype), tuple(sorted(varying_axes_of(like))))


def _read(buf: jax.Array, slot: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(buf, jnp.maximum(slot, 0), 0, keepdims=False)


def _write(buf: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buf, value, jnp.maximum(slot, 0), 0)


def _write_if(buf: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    """Store ``value`` at ``slot`` unless ``slot < 0`` (then the buffer is unchanged)."""
    keep = _read(buf, slot)
    return _write(buf, slot, jnp.where(slot >= 0, value, keep))


def _in_stage_branches(fn: Callable) -> Callable:
    """Trace ``fn`` with every kernel told it runs inside per-stage branches."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with per_stage_branches():
            return fn(*args, **kwargs)

    return wrapped


@_in_stage_branches
def run_pipeline(
    schedule: Schedule,
    *,
    chunk_fn: ChunkFn,
    embed_fn: EmbedFn,
    head_fn: HeadFn,
    stack: Any,
    rest: Any,
    tokens: jax.Array,
    positions: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    token_axes: tuple[str, ...],
    scale: jax.Array | None = None,
) -> tuple[jax.Array, Any, Any]:
    """Per-device body (inside an all-manual ``shard_map``): ``(loss, d_stack, d_rest)``.

    Args:
      schedule: the tick table; ``schedule.stages`` must equal the ``pipe`` axis size.
      stack: this stage's stacked chunk parameters, leading dimension ``V·layers_per_chunk``
        (local chunk ``v`` = rows ``[v·Lc, (v+1)·Lc)``, model chunk ``v·p + stage``).
      rest: the other parameters (embedding, final norm, head), identical on every stage.
      tokens, positions, targets, weights: this device's batch block ``[b, s]``; ``b`` is split
        into ``schedule.microbatches`` microbatches of consecutive rows.
      token_axes: the mesh axes splitting the batch and sequence (for the global token count).
      scale: multiplies the loss's gradient seed (fp16 loss scaling): every gradient comes back
        scaled, the loss does not.

    Returns:
      the mean loss over the global batch (replicated), the stack gradient (this stage's
      block) and the ``rest`` gradient (summed over ``pipe``).
    """
    p, v_chunks, m = schedule.stages, schedule.virtual_stages, schedule.microbatches
    stage = jax.lax.axis_index(PIPE)
    n_local = jax.tree.leaves(stack)[0].shape[0]
    per_chunk = n_local // v_chunks

    def split_mb(a: jax.Array) -> jax.Array:
        b = a.shape[0]
        return varying(a.reshape(m, b // m, *a.shape[1:]), (PIPE,))

    tokens, positions, targets, weights = map(split_mb, (tokens, positions, targets, weights))
    # every stage's copy of `rest` is marked varying over pipe, so gradients taken on one stage
    # stay that stage's (they are summed over pipe once, at the end)
    rest = jax.tree.map(lambda a: varying(a, (PIPE,)), rest)
    count = jax.lax.psum(jnp.sum(weights.astype(jnp.float32)), token_axes)
    count = jnp.maximum(count, 1.0)
    seed = 1.0 / count if scale is None else scale / count

    def chunk_params(v):
        return jax.tree.map(
            lambda a: jax.lax.dynamic_slice_in_dim(a, v * per_chunk, per_chunk, 0), stack
        )

    def embed(r, mb):
        return embed_fn(r, tokens[mb], positions[mb])

    # ---- abstract shapes: activation, residuals ------------------------------------------------
    x_sds = jax.eval_shape(lambda r: embed(r, 0), rest)
    res_tree: list[Any] = []

    def forward_with_residuals(params, x, pos):
        y, pullback = jax.vjp(lambda prm, xx: chunk_fn(prm, xx, pos), params, x)
        leaves, tree = jax.tree.flatten(pullback)
        res_tree[:] = [tree]
        return y, leaves

    y_sds, res_sds = jax.eval_shape(forward_with_residuals, chunk_params(0), x_sds, positions[0])
    if (y_sds.shape, y_sds.dtype) != (x_sds.shape, x_sds.dtype) or varying_axes_of(
        y_sds
    ) != varying_axes_of(x_sds):
        raise ValueError(
            f"a stack chunk maps {x_sds} to {y_sds}; it must keep the activation's shape, dtype "
            "and the mesh axes it varies over"
        )

    def as_act(x):
        # the activation's type, checked equal for the embedding and the chunk outputs above
        return varying(x, tuple(sorted(varying_axes_of(x_sds))))

    carry = {
        "act": _zeros((schedule.slots["activation"], *x_sds.shape), x_sds),
        "grad": _zeros((max(1, schedule.slots["gradient"]), *x_sds.shape), x_sds),
        "res": [_zeros((schedule.slots["residual"], *r.shape), r) for r in res_sds],
        "d_stack": jax.tree.map(lambda a: _zeros(a.shape, a), stack),
        "d_rest": jax.tree.map(lambda a: _zeros(a.shape, a), rest),
        "loss": varying(jnp.zeros((), jnp.float32), (PIPE,)),
    }
    zeros_msg = _zeros(x_sds.shape, x_sds)

    def forward(c, row, *, embed_input: bool = False, head: bool = False):
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        if embed_input:
            x = as_act(embed(rest, mb))
        else:
            x = _read(c["act"], row[COL["input_slot"]])
        y, leaves = forward_with_residuals(chunk_params(v), x, positions[mb])
        y = as_act(y)
        slot = row[COL["residual_slot"]]
        c = dict(c, res=[_write(b, slot, leaf) for b, leaf in zip(c["res"], leaves, strict=True)])
        if head:  # the loss and its gradient now; the gradient waits for this chunk's backward
            (total, _), pullback = jax.vjp(
                lambda r, yy: head_fn(r, yy, targets[mb], weights[mb]), rest, y
            )
            d_r, dy = pullback(
                (jnp.ones_like(total) * seed.astype(total.dtype), jnp.zeros_like(total))
            )
            c = dict(
                c,
                d_rest=jax.tree.map(jnp.add, c["d_rest"], d_r),
                grad=_write(c["grad"], row[COL["grad_slot"]], as_act(dy)),
                loss=c["loss"] + total / count,
            )
        return c, y, zeros_msg

    def backward(c, row, *, embed_grad: bool = False):
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        slot = row[COL["residual_slot"]]
        pullback = jax.tree.unflatten(res_tree[0], [_read(buf, slot) for buf in c["res"]])
        d_params, dx = pullback(_read(c["grad"], row[COL["grad_slot"]]))
        d_stack = jax.tree.map(
            lambda acc, g: jax.lax.dynamic_update_slice_in_dim(
                acc,
                jax.lax.dynamic_slice_in_dim(acc, v * per_chunk, per_chunk, 0) + g,
                v * per_chunk,
                0,
            ),
            c["d_stack"],
            d_params,
        )
        c = dict(c, d_stack=d_stack)
        dx = as_act(dx)
        if embed_grad:
            _, pullback = jax.vjp(lambda r: as_act(embed(r, mb)), rest)
            (d_r,) = pullback(dx)
            c = dict(c, d_rest=jax.tree.map(jnp.add, c["d_rest"], d_r))
        return c, zeros_msg, dx

    def idle(c, row):
        return c, zeros_msg, zeros_msg

    branches = {  # one per schedule.BRANCHES entry, in that order
        "idle": idle,
        "forward": forward,
        "forward_embed": functools.partial(forward, embed_input=True),
        "forward_head": functools.partial(forward, head=True),
        "backward": backward,
        "backward_embed": functools.partial(backward, embed_grad=True),
    }
    branch_fns = [branches[name] for name in BRANCHES]

    fwd_ring = [(i, (i + 1) % p) for i in range(p)]
    bwd_ring = [(i, (i - 1) % p) for i in range(p)]

    def tick(c, rows):
        row = rows[stage]
        c, send_f, send_b = jax.lax.switch(row[COL["branch"]], branch_fns, c, row)
        recv_f = jax.lax.ppermute(send_f, PIPE, fwd_ring)
        recv_b = jax.lax.ppermute(send_b, PIPE, bwd_ring)
        c = dict(
            c,
            act=_write_if(c["act"], row[COL["arrive_fwd_slot"]], recv_f),
            grad=_write_if(c["grad"], row[COL["arrive_bwd_slot"]], recv_b),
        )
        return c, None

    carry, _ = jax.lax.scan(tick, carry, jnp.asarray(schedule.table))
    loss = jax.lax.psum(carry["loss"], PIPE)
    d_rest = jax.tree.map(lambda g: jax.lax.psum(g, PIPE), carry["d_rest"])
    return loss, carry["d_stack"], d_rest


def interleave_permutation(n_layer: int, stages: int, virtual: int) -> np.ndarray:
    """Layer order that puts model chunk ``v·p + s`` at local chunk ``v`` of stage ``s`` when
    the layer axis is split contiguously over ``pipe``: ``stored[j] = model[perm[j]]``."""
    per_chunk = n_layer // (stages * virtual)
    perm = [
        (v * stages + s) * per_chunk + i
        for s in range(stages)
        for v in range(virtual)
        for i in range(per_chunk)
    ]
    return np.asarray(perm, dtype=np.int32)
