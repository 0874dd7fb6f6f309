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
  Residuals that are the chunk's parameters, or functions of them alone (a weight made varying
  over a split axis, :mod:`colossal_jax.pipeline.residuals`), are not stored: the backward
  takes them from the stack again (no tick changes it), so a slot holds activations only.
- **backward**: the residuals are taken from their slot and the ``vjp`` applied to the gradient
  received from the next stage; parameter gradients accumulate; the first chunk also runs the
  embedding's backward.
- **idle**: nothing (a bubble tick costs no compute; it still sends its zero-filled messages).

With a split backward (ZB-H1, ZB-V) the chunk runs under the linear tape
(:mod:`colossal_jax.layers.linear_tape`): the **forward** keeps the chunk's residuals in a
record, **backward_input** (B) gives the input gradient and, in the residuals' place in the
record, each linear's input and output gradient, but no weight gradient, and **weight** (W)
forms the linears' weight gradients from the record — B and W together cost the fused
backward's FLOPs. Records are read and written leaf by leaf, in place (no row-sized copies).

After the switch, the tick's one message (a forward's output or a backward's input gradient)
goes where the table says: over the ``ppermute`` ring to ``s+1`` ("up"), the ring to ``s−1``
("down") — rings, so interleaved chunks wrap from the last stage to the first — or to the stage
itself (ZB-V's turn); a ring's ``ppermute`` runs only on the ticks where some stage sends over
it (the table's ``rings`` column says so statically; every device takes the same branch of one
four-way switch: no ring, up, down, both). The receiver files
each message into the activation or gradient slot the table names. The tensor and
sequence kernels inside a chunk run unchanged: in the all-manual region the layouts call their
per-device bodies directly (:func:`colossal_jax.tensor.layout.sharded`).

Cost per device and tick: one chunk forward or backward (or nothing), and up to two ppermutes
of one microbatch's activation ``mb·s·h``, one per ring that carries a message on that tick.
A branch reads only the slots its row names and returns one tick's results; the slot buffers
and gradient sums are updated after the switch, in place (a branch that took and returned the
whole carry made XLA copy every buffer at every tick: 42 of 46 MiB per tick for GPipe at p = 4,
M = 8 on the bench's GPT). Memory: ``slots["residual"]`` chunk-residual sets (``M`` for GPipe,
``p`` for 1F1B; activations only, the chunk's parameters are read from the stack again) plus
the activation and gradient inboxes (split: ``slots["saved"]`` records instead of the residual
sets, each the larger of a residual set and the linears' inputs and output gradients,
:class:`~colossal_jax.pipeline.slots.Records`). The embedding and the head's parameters live on
every stage; their gradients are summed over ``pipe`` once per step (only the first/last stage's
are nonzero).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from colossal_jax.layers.linear_tape import chunk_tape
from colossal_jax.pipeline.residuals import ParamOnly
from colossal_jax.pipeline.schedule import BACKWARD, COL, FORWARD, SEND_DOWN, SEND_UP, Schedule
from colossal_jax.pipeline.slots import Records, read, write_if, zeros
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
    """What one device runs at a tick: a branch per entry of the schedule's
    :attr:`~colossal_jax.pipeline.schedule.Schedule.branches` on the carry (activation, gradient
    and residual slots — split: saved-input and weight-gradient slots —, the gradients and the
    loss so far), then the message routed over the ``pipe`` rings (see the module docstring).

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
        self.split = schedule.split_backward
        self.chunk_fn, self.embed_fn, self.head_fn = parts
        self.stack, self.rest, self.batch = stack, rest, batch
        self.count, self.seed = count, seed
        n_local = jax.tree.leaves(stack)[0].shape[0]
        self.per_chunk = n_local // schedule.virtual_stages
        self._res_tree: list[Any] = []
        self._derived: ParamOnly | None = None
        self.x_sds = jax.eval_shape(lambda r: self.embed(r, 0), rest)
        params, pos = self.chunk_params(0), batch.positions[0]
        if self.split:
            self._record_tape(params, pos)
        y_sds, res_sds = jax.eval_shape(self.forward_with_residuals, params, self.x_sds, pos)
        x_sds = self.x_sds
        kept = (y_sds.shape, y_sds.dtype, varying_axes_of(y_sds))
        if kept != (x_sds.shape, x_sds.dtype, varying_axes_of(x_sds)):
            raise ValueError(
                f"a stack chunk maps {x_sds} to {y_sds}; it must keep the activation's "
                "shape, dtype and the mesh axes it varies over"
            )
        slots = schedule.slots
        self.res_sds = res_sds
        self.start = {
            "act": zeros((slots["activation"], *x_sds.shape), x_sds),
            "grad": zeros((max(1, slots["gradient"]), *x_sds.shape), x_sds),
            "d_stack": jax.tree.map(lambda a: zeros(a.shape, a), stack),
            "d_rest": jax.tree.map(lambda a: zeros(a.shape, a), rest),
            "loss": varying(jnp.zeros((), jnp.float32), (PIPE,)),
        }
        if self.split:  # residuals, saved inputs and output gradients share records
            self.records = Records(
                res_sds, jax.tree.leaves(self.saved_sds), jax.tree.leaves(self.dy_sds)
            )
            self.start["rec"] = self.records.empty(slots["saved"])
        else:
            self.start["res"] = [zeros((slots["residual"], *r.shape), r) for r in res_sds]
        self.zeros_msg = zeros(x_sds.shape, x_sds)

    def _record_tape(self, params, pos) -> None:
        """The shapes of every linear call's input and outputs: both are probed in F, and B
        hands them (the input, the output gradients) to W."""

        def record(prm, x):
            with chunk_tape("record") as tape:
                self.chunk_fn(prm, x, pos)
            return tape.outputs

        calls = jax.eval_shape(record, params, self.x_sds)
        self.saved_sds = [inp for inp, _ in calls]
        self.dy_sds = [outs for _, outs in calls]
        self.probe_sds = [(inp, outs) for inp, outs in calls]

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
        """The chunk's output and the leaves of its ``vjp`` (the backward's residuals). Split,
        the ``vjp`` is taken w.r.t. ``(params, x, probes)`` with the linears' weights held
        constant: the probes' cotangents are the linears' inputs and output gradients."""

        def taped(prm, xx, probes=None):
            with chunk_tape("forward", probes) if self.split else contextlib.nullcontext():
                return self.chunk_fn(prm, xx, pos)

        probes = [jax.tree.map(lambda a: zeros(a.shape, a), self.probe_sds)] if self.split else []
        y, pullback = jax.vjp(taped, params, x, *probes)
        leaves, tree = jax.tree.flatten(pullback)
        # residuals that are the chunk's own parameters, or functions of them alone (a weight
        # made varying over a split axis, residuals.py), are not stored per microbatch: the
        # backward takes them from the stack, which no tick changes; split, the scan of the
        # layers also keeps its zero probes (its scanned inputs), which the backward rebuilds
        if self._derived is None:
            vjp_leaves = lambda *a: jax.tree.leaves(jax.vjp(taped, *a)[1])  # noqa: E731
            self._derived = ParamOnly(vjp_leaves, params, x, *probes)
        where = {id(a): ("param", i) for i, a in enumerate(jax.tree.leaves(params))}
        where |= {id(a): ("zero", i) for i, a in enumerate(jax.tree.leaves(probes))}
        derived = itertools.count()
        from_params = tuple(
            where.get(id(leaf), ("derived", next(derived)) if only else None)
            for leaf, only in zip(leaves, self._derived.mask, strict=True)
        )
        if self._res_tree and self._res_tree[1] != from_params:
            raise AssertionError("a chunk's residuals changed between traces")
        self._res_tree[:] = [tree, from_params]
        stored = [leaf for leaf, k in zip(leaves, from_params, strict=True) if k is None]
        return y, stored

    def _residuals(self, ins, row, v):
        """The chunk's ``vjp`` residuals for the backward of ``row``: the stored ones from their
        slot, the parameters (and what depends on them alone) from the stack, the zero probes
        made anew."""
        slot = row[COL["residual_slot"]]
        if self.split:
            stored = iter(self.records.unpack(ins["rec"], slot, "res"))
        else:
            stored = iter([read(b, slot) for b in ins["res"]])
        chunk = self.chunk_params(v)
        probes = jax.tree.leaves(self.probe_sds) if self.split else []
        made = {
            "param": jax.tree.leaves(chunk).__getitem__,
            "derived": self._derived.recompute(chunk).__getitem__,
            "zero": lambda i: zeros(probes[i].shape, probes[i]),
        }
        return [next(stored) if k is None else made[k[0]](k[1]) for k in self._res_tree[1]]

    def as_act(self, x):
        """``x`` typed as the activation (the embedding's and every chunk output's type)."""
        return varying(x, tuple(sorted(varying_axes_of(self.x_sds))))

    # ---- the branches ---------------------------------------------------------------------------
    # A branch gets ``ins`` (:meth:`reads`: the activation and gradient slots its row names, read
    # before the switch; the residual, saved-input and weight-gradient buffers whole, which it
    # only reads) and returns a tick's worth of results in one shape for every branch
    # (:meth:`nothing` with its own parts filled in); the slot buffers and gradient sums are
    # updated after the switch, in place. Passing the whole carry through the switch made XLA
    # copy every buffer at every tick.
    def nothing(self, ins) -> dict[str, Any]:
        """A tick's results when it does nothing: zeros of every part's type, and the other
        parameters' gradient sum as it was (passed through: a zero of its size every tick
        would cost more than the copy)."""
        out = {
            "msg": self.zeros_msg,
            "grad": self.zeros_msg,
            "d_chunk": jax.tree.map(lambda a: zeros(a.shape, a), self.chunk_params(0)),
            "d_rest": ins["d_rest"],
            "loss": varying(jnp.zeros((), jnp.float32), (PIPE,)),
        }
        out["res"] = [zeros(r.shape, r) for r in self.res_sds]
        if self.split:
            out["saved"] = [zeros(a.shape, a) for a in jax.tree.leaves(self.saved_sds)]
            out["wgrad"] = [zeros(a.shape, a) for a in jax.tree.leaves(self.dy_sds)]
        return out

    def reads(self, c, row) -> dict[str, Any]:
        """What a branch reads: the activation and gradient slots this tick's row names (read
        whatever the branch: one slot each) and the buffers a backward or W reads its slot from
        (handed in whole: a slot read before the switch would be a slot-sized temporary)."""
        ins = {
            "x": read(c["act"], row[COL["input_slot"]]),
            "grad": read(c["grad"], row[COL["grad_slot"]]),
            "d_rest": c["d_rest"],
        }
        ins["rec" if self.split else "res"] = c["rec" if self.split else "res"]
        return ins

    def forward(self, ins, row, *, embed_input: bool = False, head: bool = False):
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        x = self.as_act(self.embed(self.rest, mb)) if embed_input else ins["x"]
        y, leaves = self.forward_with_residuals(self.chunk_params(v), x, self.batch.positions[mb])
        y = self.as_act(y)
        out = dict(self.nothing(ins), msg=y)
        out["res"] = leaves
        if head:
            out.update(self.head(ins, mb, y))
        return out

    def head(self, ins, mb, y) -> dict[str, Any]:
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
        d_rest = jax.tree.map(jnp.add, ins["d_rest"], d_r)
        return {"d_rest": d_rest, "grad": self.as_act(dy), "loss": total / self.count}

    def backward(self, ins, row, *, embed_grad: bool = False):
        """The fused backward, or split (B): the input gradient, the non-linear parameters'
        gradients and, into the record, every linear's input and output gradient."""
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        pullback = jax.tree.unflatten(self._res_tree[0], self._residuals(ins, row, v))
        cotangents = pullback(ins["grad"])
        d_params, dx = cotangents[0], cotangents[1]
        dx = self.as_act(dx)
        out = dict(self.nothing(ins), msg=dx, d_chunk=d_params)
        if self.split:
            calls = cotangents[2]  # per linear call: (its input, [its output gradients])
            out["saved"] = jax.tree.leaves([x_in for x_in, _ in calls])
            out["wgrad"] = jax.tree.leaves([dys for _, dys in calls])
        if embed_grad:
            _, pullback = jax.vjp(lambda r: self.as_act(self.embed(r, mb)), self.rest)
            (d_r,) = pullback(dx)
            out["d_rest"] = jax.tree.map(jnp.add, ins["d_rest"], d_r)
        return out

    def weight(self, ins, row):
        """W: the linears' weight (and bias) gradients from their saved inputs and output
        gradients, through the layout's kernels (:mod:`colossal_jax.layers.linear_tape`)."""
        mb, v = row[COL["microbatch"]], row[COL["chunk"]]
        rec, slot, tree = ins["rec"], row[COL["saved_slot"]], jax.tree.structure
        saved = jax.tree.unflatten(tree(self.saved_sds), self.records.unpack(rec, slot, "saved"))
        dys = jax.tree.unflatten(tree(self.dy_sds), self.records.unpack(rec, slot, "wgrad"))
        pos = self.batch.positions[mb]

        def outputs(prm):
            with chunk_tape("weights", saved) as tape:
                self.chunk_fn(prm, self.zeros_msg, pos)
            return tape.outputs

        _, pullback = jax.vjp(outputs, self.chunk_params(v))
        (d_params,) = pullback(dys)
        return dict(self.nothing(ins), d_chunk=d_params)

    def idle(self, ins, row):
        return self.nothing(ins)

    def branches(self) -> list[Callable]:
        """One function per entry of the schedule's ``branches``, in order."""
        by_name = {
            "idle": self.idle,
            "forward": self.forward,
            "forward_embed": functools.partial(self.forward, embed_input=True),
            "forward_head": functools.partial(self.forward, head=True),
            "backward": self.backward,
            "backward_embed": functools.partial(self.backward, embed_grad=True),
            "backward_input": self.backward,
            "backward_input_embed": functools.partial(self.backward, embed_grad=True),
            "weight": self.weight,
        }
        return [by_name[name] for name in self.schedule.branches]

    def store(self, c, row, out) -> dict[str, Any]:
        """The carry after a tick's results ``out``: a forward's residuals and the head's
        gradient filed into their slots (split: the residuals into the record), a B's linear
        inputs and output gradients into its record, the chunk's and the other parameters'
        gradients and the loss added."""
        op, v = row[COL["op"]], row[COL["chunk"]]
        head = row[COL["branch"]] == self.schedule.branches.index("forward_head")

        def only(cond, slot):
            return jnp.where(cond, slot, -1)

        res_at = only(op == FORWARD, row[COL["residual_slot"]])
        c = dict(
            c,
            grad=write_if(c["grad"], only(head, row[COL["grad_slot"]]), out["grad"]),
            d_stack=self.add_chunk_grad(c["d_stack"], v, out["d_chunk"]),
            d_rest=out["d_rest"],
            loss=c["loss"] + out["loss"],
        )
        if self.split:
            rec = self.records.store(c["rec"], res_at, {"res": out["res"]})
            b_at = only(op == BACKWARD, row[COL["wgrad_slot"]])
            c["rec"] = self.records.store(rec, b_at, {"saved": out["saved"], "wgrad": out["wgrad"]})
        else:
            c["res"] = [write_if(b, res_at, a) for b, a in zip(c["res"], out["res"], strict=True)]
        return c

    def tick_fn(self, stage: jax.Array) -> Callable:
        """``tick(carry, rows) -> (carry, None)`` for ``lax.scan`` over the tick table: this
        stage's branch on the slots its row reads, the results stored, its message over the
        ring the table names (up to ``s+1``, down to ``s−1``, or to itself), and the messages
        received filed into the slots the table names."""
        p = self.schedule.stages
        branch_fns = self.branches()
        up_ring = [(i, (i + 1) % p) for i in range(p)]
        down_ring = [(i, (i - 1) % p) for i in range(p)]

        def messages(rings, msg, send) -> tuple[jax.Array, jax.Array]:
            """What arrives over the up and the down ring: a ``ppermute`` only for a ring that
            carries a message this tick (the table's ``rings`` column, the same on every
            stage, so every device takes the same branch), zeros otherwise."""
            up = jnp.where(send == SEND_UP, msg, self.zeros_msg)
            down = jnp.where(send == SEND_DOWN, msg, self.zeros_msg)

            def quiet(a):  # zeros with a's varying axes, as the switch's branches must agree
                return jnp.where(False, a, self.zeros_msg)

            def none(u, d):
                return quiet(u), quiet(d)

            def up_only(u, d):
                return jax.lax.ppermute(u, PIPE, up_ring), quiet(d)

            def down_only(u, d):
                return quiet(u), jax.lax.ppermute(d, PIPE, down_ring)

            def both(u, d):
                return jax.lax.ppermute(u, PIPE, up_ring), jax.lax.ppermute(d, PIPE, down_ring)

            return jax.lax.switch(rings, (none, up_only, down_only, both), up, down)

        def tick(c, rows):
            row = rows[stage]
            out = jax.lax.switch(row[COL["branch"]], branch_fns, self.reads(c, row), row)
            c = self.store(c, row, out)
            msg = out["msg"]
            send = row[COL["send"]]
            recv_up, recv_down = messages(row[COL["rings"]], msg, send)
            recv = {"up": recv_up, "down": recv_down, "self": msg}
            act, grad = c["act"], c["grad"]
            for route, value in recv.items():
                act = write_if(act, row[COL[f"recv_{route}_act"]], value)
                grad = write_if(grad, row[COL[f"recv_{route}_grad"]], value)
            return dict(c, act=act, grad=grad), None

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
      block) and this stage's part of the ``rest`` gradient (the caller sums it over ``pipe``).
    """
    stage = jax.lax.axis_index(PIPE)
    batch = _Microbatches.split(schedule.microbatches, tokens, positions, targets, weights)
    # every stage's copy of `rest` is marked varying over pipe, so gradients taken on one stage
    # stay that stage's (the caller sums them over pipe once, at the end)
    rest = jax.tree.map(lambda a: varying(a, (PIPE,)), rest)
    count = jax.lax.psum(jnp.sum(batch.weights.astype(jnp.float32)), token_axes)
    count = jnp.maximum(count, 1.0)
    seed = 1.0 / count if scale is None else scale / count
    program = _StageProgram(
        schedule, (chunk_fn, embed_fn, head_fn), stack, rest, batch, count, seed
    )
    carry, _ = jax.lax.scan(program.tick_fn(stage), program.start, jnp.asarray(schedule.table))
    loss = jax.lax.psum(carry["loss"], PIPE)
    return loss, carry["d_stack"], carry["d_rest"]
