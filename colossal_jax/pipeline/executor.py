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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Microbatches:
    """This device's batch block cut into microbatches of consecutive rows: ``[m, b/m, s]`` each,
    marked varying over ``pipe`` (every stage holds its own copy)."""

    tokens: jax.Array
    positions: jax.Array
    targets: jax.Array
    weights: jax.Array

    @classmethod
    def split(cls, m: int, *arrays: jax.Array) -> _Microbatches:
        def split_mb(a: jax.Array) -> jax.Array:
            b = a.shape[0]
            return varying(a.reshape(m, b // m, *a.shape[1:]), (PIPE,))

        return cls(*map(split_mb, arrays))


class _StageProgram:
    """What one device runs at a tick: a branch per :data:`~colossal_jax.pipeline.schedule.
    BRANCHES` entry on the carry (activation, gradient and residual slots, the gradients and the
    loss so far), then the two ``ppermute`` rings over ``pipe`` (see the module docstring).

    Constructing it traces the embedding and one chunk abstractly to size the slots, checks that
    a chunk keeps the activation's type, and builds :attr:`start`, the carry before the first
    tick."""

    def __init__(
        self,
        schedule: Schedule,
        parts: tuple[ChunkFn, EmbedFn, HeadFn],
        stack: Any,
        rest: Any,
        batch: _Microbatches,
        count: jax.Array,
        seed: jax.Array,
    ):
        self.schedule = schedule
        self.chunk_fn, self.embed_fn, self.head_fn = parts
        self.stack, self.rest, self.batch = stack, rest, batch
        self.count, self.seed = count, seed
        n_local = jax.tree.leaves(stack)[0].shape[0]
        self.per_chunk = n_local // schedule.virtual_stages
        self._res_tree: list[Any] = []
        self.x_sds = jax.eval_shape(lambda r: self.embed(r, 0), rest)
        y_sds, res_sds = jax.eval_shape(
            self.forward_with_residuals, self.chunk_params(0), self.x_sds, batch.positions[0]
        )
        x_sds = self.x_sds
        kept = (y_sds.shape, y_sds.dtype, varying_axes_of(y_sds))
        if kept != (x_sds.shape, x_sds.dtype, varying_axes_of(x_sds)):
            raise ValueError(
                f"a stack chunk maps {x_sds} to {y_sds}; it must keep the activation's "
                "shape, dtype and the mesh axes it varies over"
            )
        slots = schedule.slots
        self.start = {
            "act": _zeros((slots["activation"], *x_sds.shape), x_sds),
            "grad": _zeros((max(1, slots["gradient"]), *x_sds.shape), x_sds),
            "res": [_zeros((slots["residual"], *r.shape), r) for r in res_sds],
            "d_stack": jax.tree.map(lambda a: _zeros(a.shape, a), stack),
            "d_rest": jax.tree.map(lambda a: _zeros(a.shape, a), rest),
            "loss": varying(jnp.zeros((), jnp.float32), (PIPE,)),
        }
        self.zeros_msg = _zeros(x_sds.shape, x_sds)

    # ---- the model's parts on this stage ------------------------------------------------------
    def chunk_params(self, v):
        """Local chunk ``v``'s rows of the stacked parameters."""
        n = self.per_chunk
        return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, v * n, n, 0), self.stack)

    def add_chunk_grad(self, d_stack, v, d_params):
        """``d_stack`` with ``d_params`` added to local chunk ``v``'s rows."""
        n = self.per_chunk
        return jax.tree.map(
            lambda acc, g: jax.lax.dynamic_update_slice_in_dim(
                acc, jax.lax.dynamic_slice_in_dim(acc, v * n, n, 0) + g, v * n, 0
            ),
            d_stack,
            d_params,
        )

    def embed(self, r, mb):
        return self.embed_fn(r, self.batch.tokens[mb], self.batch.positions[mb])

    def forward_with_residuals(self, params, x, pos):
        """The chunk's output and the leaves of its ``vjp`` (the backward's residuals)."""
        y, pullback = jax.vjp(lambda prm, xx: self.chunk_fn(prm, xx, pos), params, x)
        leaves, tree = jax.tree.flatten(pullback)
        self._res_tree[:] = [tree]
        return y, leaves

    def as_act(self, x):
        """``x`` typed as the activation (the embedding's and every chunk output's type)."""
        return varying(x, tuple(sorted(varying_axes_of(self.x_sds))))

    # ---- the branches ---------------------------------------------------------------------------
    def forward(self, c, row, *, embed_input: bool = False, head: bool = False):
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        if embed_input:
            x = self.as_act(self.embed(self.rest, mb))
        else:
            x = _read(c["act"], row[COL["input_slot"]])
        y, leaves = self.forward_with_residuals(self.chunk_params(v), x, self.batch.positions[mb])
        y = self.as_act(y)
        slot = row[COL["residual_slot"]]
        c = dict(c, res=[_write(b, slot, leaf) for b, leaf in zip(c["res"], leaves, strict=True)])
        if head:
            c = self.head(c, row, mb, y)
        return c, y, self.zeros_msg

    def head(self, c, row, mb, y):
        """The loss of microbatch ``mb`` from the last chunk's output ``y``, and its gradient now;
        the gradient waits in its slot for this chunk's backward."""
        (total, _), pullback = jax.vjp(
            lambda r, yy: self.head_fn(r, yy, self.batch.targets[mb], self.batch.weights[mb]),
            self.rest,
            y,
        )
        d_r, dy = pullback(
            (jnp.ones_like(total) * self.seed.astype(total.dtype), jnp.zeros_like(total))
        )
        return dict(
            c,
            d_rest=jax.tree.map(jnp.add, c["d_rest"], d_r),
            grad=_write(c["grad"], row[COL["grad_slot"]], self.as_act(dy)),
            loss=c["loss"] + total / self.count,
        )

    def backward(self, c, row, *, embed_grad: bool = False):
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        slot = row[COL["residual_slot"]]
        pullback = jax.tree.unflatten(self._res_tree[0], [_read(buf, slot) for buf in c["res"]])
        d_params, dx = pullback(_read(c["grad"], row[COL["grad_slot"]]))
        c = dict(c, d_stack=self.add_chunk_grad(c["d_stack"], v, d_params))
        dx = self.as_act(dx)
        if embed_grad:
            _, pullback = jax.vjp(lambda r: self.as_act(self.embed(r, mb)), self.rest)
            (d_r,) = pullback(dx)
            c = dict(c, d_rest=jax.tree.map(jnp.add, c["d_rest"], d_r))
        return c, self.zeros_msg, dx

    def idle(self, c, row):
        return c, self.zeros_msg, self.zeros_msg

    def branches(self) -> list[Callable]:
        """One function per :data:`~colossal_jax.pipeline.schedule.BRANCHES` entry, in order."""
        by_name = {
            "idle": self.idle,
            "forward": self.forward,
            "forward_embed": functools.partial(self.forward, embed_input=True),
            "forward_head": functools.partial(self.forward, head=True),
            "backward": self.backward,
            "backward_embed": functools.partial(self.backward, embed_grad=True),
        }
        return [by_name[name] for name in BRANCHES]

    def tick_fn(self, stage: jax.Array) -> Callable:
        """``tick(carry, rows) -> (carry, None)`` for ``lax.scan`` over the tick table: this
        stage's branch, the forward ring to ``s+1``, the backward ring to ``s−1``, and the
        messages received filed into the slots the table names."""
        p = self.schedule.stages
        branch_fns = self.branches()
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

        return tick


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
    stage = jax.lax.axis_index(PIPE)
    batch = _Microbatches.split(schedule.microbatches, tokens, positions, targets, weights)
    # every stage's copy of `rest` is marked varying over pipe, so gradients taken on one stage
    # stay that stage's (they are summed over pipe once, at the end)
    rest = jax.tree.map(lambda a: varying(a, (PIPE,)), rest)
    count = jax.lax.psum(jnp.sum(batch.weights.astype(jnp.float32)), token_axes)
    count = jnp.maximum(count, 1.0)
    seed = 1.0 / count if scale is None else scale / count
    program = _StageProgram(
        schedule, (chunk_fn, embed_fn, head_fn), stack, rest, batch, count, seed
    )
    carry, _ = jax.lax.scan(program.tick_fn(stage), program.start, jnp.asarray(schedule.table))
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
