"""Pipeline schedules as data: a tick table saying, for every tick and stage, which microbatch
and which model chunk runs forward or backward.

A schedule is built in two steps, both plain Python:

1. **Order.** Each stage gets the ordered list of its operations ``(F|B|W, microbatch, chunk)``
   from the registered schedule's order function (:mod:`colossal_jax.config.pipelines`; any
   order that respects the dependencies below is timed and allocated the same way):
   - GPipe (Huang et al. 2019): every forward, then every backward.
   - 1F1B (Narayanan et al. 2021, PipeDream-Flush): ``p − s − 1`` warm-up forwards on stage
     ``s``, then one forward and one backward alternately, then the remaining backwards. A stage
     keeps at most ``p − s`` microbatches' activations alive.
   - Interleaved 1F1B (Narayanan et al. 2021, §2.2): ``V`` model chunks per stage, chunk ``c``
     on stage ``c mod p`` (stage ``s`` holds chunks ``s, s+p, …``); microbatches go through the
     chunks in groups of ``p``; warm-up ``2·(p − s − 1) + (V − 1)·p`` forwards (Megatron-LM's).
   - ZB-H1 and ZB-V (Qi et al. 2024, :mod:`colossal_jax.pipeline.zero_bubble`): the backward
     split into **B** (the activation gradient) and **W** (the weight gradient, any time after
     its B), W filling the bubbles; ZB-V places two chunks per stage in a V (stage ``s`` holds
     chunks ``s`` and ``2p − 1 − s``).
2. **Timing.** A synchronous simulation, one operation per stage per tick: a stage runs its next
   operation once its input is there — the forward of chunk ``c`` needs the forward of ``c − 1``
   (on the previous stage) done in an earlier tick, the backward of ``c`` needs the backward of
   ``c + 1`` done earlier (the last chunk's backward needs its own forward, whose tick also ran
   the loss head); a W needs its own B done earlier. Messages sent at the end of a tick are
   usable from the next tick; each goes to the stage holding the next (forward) or previous
   (backward) chunk: over the ring to ``s+1`` ("up"), the ring to ``s−1`` ("down"), or to itself
   (ZB-V's turn at the bottom of the V).

The timing then assigns buffer **slots** (a first-free allocator per stage): residuals saved by a
forward until its backward, activations received from the previous stage until their forward,
gradients received from the next stage until their backward; with a split backward also the
linears' inputs saved by a forward and their output gradients computed by a B, both until the
W. Every stage allocates the largest count any stage needs, so the per-device memory is that of
the busiest stage (stage 0).

Idle fraction (one operation a tick, whatever its cost): with ``T`` ticks and ``2·M·V``
operations per stage (``3·M·V`` with a split backward), ``1 − 2MV/T``; for GPipe and 1F1B it is
``(p−1)/(M+p−1)``, for interleaved 1F1B ``(p−1)/(V·M+p−1)`` (docs/formulas.md). Weighing the
operations by their costs is :mod:`colossal_jax.pipeline.timing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from colossal_jax.config.pipelines import TABLE, pipeline_schedule

SCHEDULES = TABLE.names(lambda schedule: schedule.pipelined)
"""The names of the registered schedules that run a pipeline (a live view)."""

IDLE, FORWARD, BACKWARD, WEIGHT = 0, 1, 2, 3
"""Operation kinds. BACKWARD is the whole backward of a fused schedule and only the activation
gradient (B) of a split one, whose weight gradient is its WEIGHT (W) operation."""

# what the executor runs at a tick: the operation, specialised at the model's two ends
FUSED_BRANCHES = ("idle", "forward", "forward_embed", "forward_head", "backward", "backward_embed")
SPLIT_BRANCHES = (
    "idle",
    "forward",
    "forward_embed",
    "forward_head",
    "backward_input",
    "backward_input_embed",
    "weight",
)
BRANCHES = FUSED_BRANCHES
"""The branches of a fused schedule (a split one's are :data:`SPLIT_BRANCHES`)."""

# message routes: where an operation's output goes at the end of its tick
NO_SEND, SEND_UP, SEND_DOWN, SEND_SELF = 0, 1, 2, 3
RINGS_NONE, RINGS_UP, RINGS_DOWN, RINGS_BOTH = 0, 1, 2, 3
"""The ``rings`` column: ``(some stage sends up) + 2·(some stage sends down)``."""

# columns of Schedule.table[t, s]
COLUMNS = (
    "op",  # IDLE / FORWARD / BACKWARD / WEIGHT
    "branch",  # index into Schedule.branches (forward_embed: chunk 0; forward_head: the last)
    "microbatch",
    "chunk",  # local chunk index on this stage (Schedule.local_chunk)
    "residual_slot",  # F: where its residuals go; B: where they are read
    "input_slot",  # F: activation inbox slot to read (-1: the embedding of the microbatch)
    "grad_slot",  # B: gradient inbox slot to read; F of the last chunk: where the loss head's
    #               gradient is written
    "saved_slot",  # split F: where the linears' inputs go; W: where they are read
    "wgrad_slot",  # split B: where the linears' output gradients go; W: where they are read
    "send",  # NO_SEND / SEND_UP (ring to s+1) / SEND_DOWN (ring to s-1) / SEND_SELF
    # end of tick: file the message received over each route into this slot (-1: none)
    "recv_up_act",  # from s-1 over the up ring, an activation
    "recv_up_grad",  # from s-1 over the up ring, a gradient (ZB-V's rising arm)
    "recv_down_act",  # from s+1 over the down ring, an activation (ZB-V's rising arm)
    "recv_down_grad",  # from s+1 over the down ring, a gradient
    "recv_self_act",  # from this stage itself (ZB-V: chunk p-1 to chunk p)
    "recv_self_grad",  # from this stage itself (ZB-V: chunk p's gradient to chunk p-1)
    "rings",  # the same on every stage of a tick: which rings carry a message this tick,
    #           RINGS_NONE / RINGS_UP / RINGS_DOWN / RINGS_BOTH (the executor's message switch)
)
COL = {name: i for i, name in enumerate(COLUMNS)}


@dataclass(frozen=True)
class Op:
    kind: int  # FORWARD, BACKWARD or WEIGHT
    microbatch: int
    chunk: int  # global chunk index c in model order


def place(chunk: int, p: int, v: int, placement: str) -> tuple[int, int]:
    """``(stage, local chunk)`` of model chunk ``chunk``: ``"loop"`` puts chunk ``c`` on stage
    ``c mod p`` as local chunk ``c // p``; ``"v"`` (two chunks per stage) puts chunk ``c < p`` on
    stage ``c`` and chunk ``c >= p`` on stage ``2p − 1 − c``, both as local chunks 0 and 1."""
    if placement == "loop":
        return chunk % p, chunk // p
    if placement == "v":
        if v != 2:
            raise ValueError(f"a V placement holds 2 chunks per stage, got {v}")
        return (chunk, 0) if chunk < p else (2 * p - 1 - chunk, 1)
    raise ValueError(f"unknown chunk placement {placement!r}; use loop or v")


@dataclass
class Schedule:
    """A timed schedule.

    Attributes:
      name, stages (p), microbatches (M), virtual_stages (V: chunks per stage).
      placement: ``"loop"`` or ``"v"`` (:func:`place`).
      orders: per stage, its operations in execution order.
      timeline: ``timeline[t][s]`` is the :class:`Op` stage ``s`` runs at tick ``t`` (or None).
      table: ``int32 [T, p, len(COLUMNS)]``, what the executor indexes (see ``COLUMNS``).
      slots: how many residual, activation-inbox, gradient-inbox, saved-input and
        weight-gradient slots each stage allocates. With a split backward the residuals, saved
        inputs and weight gradients share one **record** per microbatch-chunk, from its F to
        its W (``saved`` records; the output gradients take the residuals' place at the B), and
        ``residual``/``wgrad`` count only how many of each are alive at once.
      peak_alive: per stage, the most microbatch-chunks whose residuals were alive at once
        (with a split backward: whose saved inputs, kept until the W).
    """

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
    placement: str
    orders: list[list[Op]]
    timeline: list[list[Op | None]]
    table: np.ndarray = field(repr=False)
    slots: dict[str, int]
    peak_alive: list[int]

    @property
    def ticks(self) -> int:
        return len(self.timeline)

    @property
    def chunks(self) -> int:
        return self.stages * self.virtual_stages

    @property
    def split_backward(self) -> bool:
        """Its backward runs as B and W operations."""
        return any(op.kind == WEIGHT for order in self.orders for op in order)

    @property
    def branches(self) -> tuple[str, ...]:
        """The executor's branches, which the table's ``branch`` column indexes."""
        return SPLIT_BRANCHES if self.split_backward else FUSED_BRANCHES

    def stage_of(self, chunk: int) -> int:
        return place(chunk, self.stages, self.virtual_stages, self.placement)[0]

    def chunk_at(self, stage: int, local: int) -> int:
        """The model chunk stored as local chunk ``local`` of stage ``stage``."""
        p, v = self.stages, self.virtual_stages
        return next(c for c in range(p * v) if place(c, p, v, self.placement) == (stage, local))

    def branch_counts(self, stage: int) -> list[int]:
        """How many ticks stage ``stage`` runs each of :attr:`branches`."""
        column = self.table[:, stage, COL["branch"]]
        return [int((column == i).sum()) for i in range(len(self.branches))]

    def ring_counts(self) -> list[int]:
        """How many ticks run each branch of the executor's message switch: no ring, the up
        ring only, the down ring only, both (the ``rings`` column)."""
        column = self.table[:, 0, COL["rings"]]
        return [int((column == i).sum()) for i in range(RINGS_BOTH + 1)]

    def busy_ticks(self, stage: int) -> int:
        return sum(1 for row in self.timeline if row[stage] is not None)

    def idle_fraction(self) -> float:
        """Fraction of stage-ticks with no work (the pipeline bubble), over all stages."""
        busy = sum(self.busy_ticks(s) for s in range(self.stages))
        return 1.0 - busy / (self.ticks * self.stages)

    def formula_bubble(self) -> float:
        """The closed form ``(p−1)/(k·V·M+p−1)`` with ``k`` operations per microbatch-chunk:
        ``k = 1`` for GPipe, 1F1B (V = 1) and interleaved 1F1B; ``k = 3`` (F, B, W) for ZB-H1
        (V = 1) and ZB-V (V = 2) — a bubble of ``p − 1`` ticks in every case, which the tests
        check against the table."""
        p, m, v = self.stages, self.microbatches, self.virtual_stages
        ops = 3 if self.split_backward else 1
        return (p - 1) / (ops * v * m + p - 1)

    def render(self) -> str:
        """The timeline as text, a row per stage: ``F3``/``B3``/``W3`` (``F3.1``: local chunk
        1), ``.`` idle."""
        width = 4 if self.virtual_stages == 1 else 6
        lines = []
        for s in range(self.stages):
            cells = []
            for row in self.timeline:
                op = row[s]
                if op is None:
                    cells.append(".".center(width))
                    continue
                tag = "?FBW"[op.kind] + str(op.microbatch)
                if self.virtual_stages > 1:
                    tag += (
                        f".{place(op.chunk, self.stages, self.virtual_stages, self.placement)[1]}"
                    )
                cells.append(tag.center(width))
            lines.append(f"stage {s}: " + "".join(cells))
        return "\n".join(lines)


def stage_orders(name: str, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """Each stage's operations in execution order (global chunk indices), from the registered
    schedule ``name``'s order function (:mod:`colossal_jax.config.pipelines`)."""
    return pipeline_schedule(name).order_function()(p, m, v)


def gpipe_order(p: int, m: int, v: int = 1) -> list[list[Op]]:
    """GPipe: on every stage, every microbatch's forward, then every backward."""
    return [
        [Op(FORWARD, i, s) for i in range(m)] + [Op(BACKWARD, i, s) for i in range(m)]
        for s in range(p)
    ]


def one_f_one_b_order(p: int, m: int, v: int = 1) -> list[list[Op]]:
    """1F1B: ``p − s − 1`` warm-up forwards on stage ``s``, then one forward and one backward in
    turn, then the remaining backwards."""
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [Op(FORWARD, i, s) for i in range(warm)]
        for i in range(m - warm):
            ops += [Op(FORWARD, warm + i, s), Op(BACKWARD, i, s)]
        ops += [Op(BACKWARD, i, s) for i in range(m - warm, m)]
        orders.append(ops)
    return orders


def interleaved_order(p: int, m: int, v: int) -> list[list[Op]]:
    """Interleaved 1F1B: Megatron-LM's order on every stage (``v`` chunks per stage)."""
    return [_interleaved_order(s, p, m, v) for s in range(p)]


def _interleaved_order(s: int, p: int, m: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved order for stage ``s`` (microbatches in groups of ``p``)."""
    total = m * v

    def fwd(k: int) -> Op:
        group, within = divmod(k, p * v)
        chunk_local = within // p
        mb = group * p + within % p
        return Op(FORWARD, mb, chunk_local * p + s)

    def bwd(k: int) -> Op:
        group, within = divmod(k, p * v)
        chunk_local = v - 1 - within // p
        mb = group * p + within % p
        return Op(BACKWARD, mb, chunk_local * p + s)

    if m == p:
        warm = total
    else:
        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
    ops = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        ops += [fwd(warm + k), bwd(k)]
    ops += [bwd(k) for k in range(total - warm, total)]
    return ops


def build(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Order, time and allocate the schedule ``name`` for ``stages × microbatches``."""
    p, m, v = stages, microbatches, virtual_stages
    if p < 2:
        raise ValueError(f"a pipeline needs at least 2 stages, got {p}")
    if m < 1:
        raise ValueError(f"a pipeline needs at least one microbatch, got {m}")
    registered = pipeline_schedule(name)
    if registered.chunks is not None and v != registered.chunks:
        raise ValueError(
            f"--pipeline {name} runs {registered.chunks} chunks per stage; use "
            f"--virtual-stages {registered.chunks}"
        )
    if not registered.virtual and registered.chunks is None and v != 1:
        virtual = "|".join(TABLE.names(lambda schedule: schedule.virtual))
        raise ValueError(f"--virtual-stages {v} needs --pipeline {virtual}")
    orders = stage_orders(name, p, m, v)
    timeline = simulate(orders, p, v, registered.placement)
    table, slots, peak = _allocate(timeline, p, v, registered.placement)
    return Schedule(name, p, m, v, registered.placement, orders, timeline, table, slots, peak)


def dependency(op: Op, last: int) -> tuple[int, int, int] | None:
    """The operation ``op`` waits for, as ``(kind, microbatch, chunk)`` (None: the embedding's
    forward waits for nothing)."""
    if op.kind == FORWARD:
        return None if op.chunk == 0 else (FORWARD, op.microbatch, op.chunk - 1)
    if op.kind == WEIGHT:
        return (BACKWARD, op.microbatch, op.chunk)
    if op.chunk == last:
        return (FORWARD, op.microbatch, op.chunk)
    return (BACKWARD, op.microbatch, op.chunk + 1)


def simulate(
    orders: list[list[Op]], p: int, v: int, placement: str = "loop"
) -> list[list[Op | None]]:
    """One operation per stage per tick, each as soon as its :func:`dependency` ran in an
    earlier tick; raises if an order deadlocks or runs an operation on the wrong stage."""
    last = p * v - 1
    for s, order in enumerate(orders):
        for op in order:
            if place(op.chunk, p, v, placement)[0] != s:
                raise ValueError(f"{op} is ordered on stage {s}, but its chunk is elsewhere")
    done: dict[tuple[int, int, int], int] = {}  # (kind, mb, chunk) -> tick it ran
    pos = [0] * p
    timeline: list[list[Op | None]] = []
    total = sum(len(o) for o in orders)
    ran = 0
    t = 0
    while ran < total:
        row: list[Op | None] = [None] * p
        for s in range(p):
            if pos[s] >= len(orders[s]):
                continue
            op = orders[s][pos[s]]
            dep = dependency(op, last)
            if dep is None or done.get(dep, t) < t:
                row[s] = op
        for s, op in enumerate(row):
            if op is not None:
                done[(op.kind, op.microbatch, op.chunk)] = t
                pos[s] += 1
                ran += 1
        timeline.append(row)
        t += 1
        if t > 4 * total + 4 * p:
            raise RuntimeError("pipeline schedule deadlocked (an order violates a dependency)")
    return timeline


def _branch(op: Op, last: int, split: bool) -> int:
    names = SPLIT_BRANCHES if split else FUSED_BRANCHES
    if op.kind == FORWARD:
        if op.chunk == 0:
            name = "forward_embed"
        else:
            name = "forward_head" if op.chunk == last else "forward"
    elif op.kind == WEIGHT:
        name = "weight"
    else:
        name = "backward_input" if split else "backward"
        if op.chunk == 0:
            name += "_embed"
    return names.index(name)


class _Slots:
    """First-free slot allocator, one per stage, with a key for each slot taken."""

    def __init__(self) -> None:
        self.used: set[int] = set()
        self.at: dict[tuple[int, int], int] = {}
        self.peak = 0

    def take(self, key: tuple[int, int]) -> int:
        i = 0
        while i in self.used:
            i += 1
        self.used.add(i)
        self.at[key] = i
        self.peak = max(self.peak, len(self.used))
        return i

    def free(self, key: tuple[int, int]) -> int:
        i = self.at.pop(key)
        self.used.remove(i)
        return i


def _route(src: int, dst: int, p: int) -> int:
    if dst == src:
        return SEND_SELF
    return SEND_UP if dst == (src + 1) % p else SEND_DOWN


def _allocate(
    timeline: list[list[Op | None]], p: int, v: int, placement: str
) -> tuple[np.ndarray, dict[str, int], list[int]]:
    last = p * v - 1
    split = any(op is not None and op.kind == WEIGHT for row in timeline for op in row)
    table = np.full((len(timeline), p, len(COLUMNS)), -1, dtype=np.int32)
    table[:, :, COL["op"]] = IDLE
    table[:, :, COL["branch"]] = 0
    table[:, :, COL["microbatch"]] = 0
    table[:, :, COL["chunk"]] = 0
    table[:, :, COL["send"]] = NO_SEND
    pools = {k: [_Slots() for _ in range(p)] for k in ("res", "act", "grad", "saved", "wgrad")}
    for t, row in enumerate(timeline):
        for s, op in enumerate(row):  # 1. operations read and free their slots
            if op is not None:
                _fill_cell(table[t, s], op, pools, s, last, split, p, v, placement)
        for s, op in enumerate(row):  # 2. messages sent this tick arrive at their stage
            if op is None or op.kind == WEIGHT:
                continue
            if op.kind == FORWARD and op.chunk < last:
                key, kind = (op.microbatch, op.chunk + 1), "act"
            elif op.kind == BACKWARD and op.chunk > 0:
                key, kind = (op.microbatch, op.chunk - 1), "grad"
            else:
                continue
            dst = place(key[1], p, v, placement)[0]
            route = _route(s, dst, p)
            table[t, s, COL["send"]] = route
            column = {SEND_UP: "recv_up", SEND_DOWN: "recv_down", SEND_SELF: "recv_self"}[route]
            table[t, dst, COL[f"{column}_{kind}"]] = pools[kind][dst].take(key)
    sends = table[:, :, COL["send"]]
    rings = (sends == SEND_UP).any(axis=1) + 2 * (sends == SEND_DOWN).any(axis=1)
    table[:, :, COL["rings"]] = rings[:, None]
    slots = {
        "residual": max(a.peak for a in pools["res"]),
        "activation": max(1, max(a.peak for a in pools["act"])),
        "gradient": max(a.peak for a in pools["grad"]),
        "saved": max(a.peak for a in pools["saved"]),
        "wgrad": max(a.peak for a in pools["wgrad"]),
    }
    alive = pools["saved"] if split else pools["res"]
    return table, slots, [a.peak for a in alive]


def _fill_cell(cell, op: Op, pools, s: int, last: int, split: bool, p: int, v: int, placement):
    """Write ``op``'s entry of the table: what it reads (and frees) and where its results go."""
    cell[COL["op"]] = op.kind
    cell[COL["branch"]] = _branch(op, last, split)
    cell[COL["microbatch"]] = op.microbatch
    cell[COL["chunk"]] = place(op.chunk, p, v, placement)[1]
    key = (op.microbatch, op.chunk)
    # split: one *record* per (microbatch, chunk) from its F to its W — the saved-input pool's
    # slot — holds the linears' inputs, the residuals until the B and then, in the residuals'
    # place, the output gradients; the residual and weight-gradient pools only count how many
    # of each are alive at once
    if op.kind == FORWARD:
        if op.chunk > 0:
            cell[COL["input_slot"]] = pools["act"][s].free(key)
        cell[COL["residual_slot"]] = pools["res"][s].take(key)
        if split:
            cell[COL["saved_slot"]] = cell[COL["residual_slot"]] = pools["saved"][s].take(key)
        if op.chunk == last:  # the loss head's gradient waits for this chunk's backward
            cell[COL["grad_slot"]] = pools["grad"][s].take(key)
    elif op.kind == BACKWARD:
        cell[COL["residual_slot"]] = pools["res"][s].free(key)
        cell[COL["grad_slot"]] = pools["grad"][s].free(key)
        if split:
            pools["wgrad"][s].take(key)
            record = pools["saved"][s].at[key]
            cell[COL["residual_slot"]] = cell[COL["wgrad_slot"]] = record
    else:
        pools["wgrad"][s].free(key)
        cell[COL["saved_slot"]] = cell[COL["wgrad_slot"]] = pools["saved"][s].free(key)
