"""Pipeline schedules as data: a tick table saying, for every tick and stage, which microbatch
and which model chunk runs forward or backward.

A schedule is built in two steps, both plain Python:

1. **Order.** Each stage gets the ordered list of its operations ``(F|B, microbatch, chunk)``
   from the registered schedule's order function (:mod:`colossal_jax.config.pipelines`; any
   order that respects the dependencies below is timed and allocated the same way):
   - GPipe (Huang et al. 2019): every forward, then every backward.
   - 1F1B (Narayanan et al. 2021, PipeDream-Flush): ``p − s − 1`` warm-up forwards on stage
     ``s``, then one forward and one backward alternately, then the remaining backwards. A stage
     keeps at most ``p − s`` microbatches' activations alive.
   - Interleaved 1F1B (Narayanan et al. 2021, §2.2): ``V`` model chunks per stage, chunk ``c``
     on stage ``c mod p`` (stage ``s`` holds chunks ``s, s+p, …``); microbatches go through the
     chunks in groups of ``p``; warm-up ``2·(p − s − 1) + (V − 1)·p`` forwards (Megatron-LM's).
2. **Timing.** A synchronous simulation, one operation per stage per tick: a stage runs its next
   operation once its input is there — the forward of chunk ``c`` needs the forward of ``c − 1``
   (on the previous stage) done in an earlier tick, the backward of ``c`` needs the backward of
   ``c + 1`` done earlier (the last chunk's backward needs its own forward, whose tick also ran
   the loss head). Messages sent at the end of a tick are usable from the next tick.

The timing then assigns buffer **slots** (a first-free allocator per stage): residuals saved by a
forward until its backward, activations received from the previous stage until their forward,
gradients received from the next stage until their backward. Every stage allocates the largest
count any stage needs, so the per-device memory is that of the busiest stage (stage 0).

Idle fraction: with ``T`` ticks and ``2·M·V`` operations per stage, ``1 − 2MV/T``; for GPipe and
1F1B it is ``(p−1)/(M+p−1)``, for interleaved 1F1B ``(p−1)/(V·M+p−1)`` (docs/formulas.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from colossal_jax.config.pipelines import TABLE, pipeline_schedule

SCHEDULES = TABLE.names(lambda schedule: schedule.pipelined)
"""The names of the registered schedules that run a pipeline (a live view)."""

IDLE, FORWARD, BACKWARD = 0, 1, 2

# what the executor runs at a tick: the operation, specialised at the model's two ends
BRANCHES = ("idle", "forward", "forward_embed", "forward_head", "backward", "backward_embed")
BRANCH = {name: i for i, name in enumerate(BRANCHES)}

# columns of Schedule.table[t, s]
COLUMNS = (
    "op",  # IDLE / FORWARD / BACKWARD
    "branch",  # index into BRANCHES (forward_embed: chunk 0; forward_head: the last chunk)
    "microbatch",
    "chunk",  # local chunk index v on this stage (global chunk = v·p + s)
    "residual_slot",  # F: where its residuals go; B: where they are read
    "input_slot",  # F: activation inbox slot to read (-1: the embedding of the microbatch)
    "grad_slot",  # B: gradient inbox slot to read; F of the last chunk: where the loss head's
    #               gradient is written
    "arrive_fwd_slot",  # end of tick: store the activation received from stage s-1 here (-1: none)
    "arrive_bwd_slot",  # end of tick: store the gradient received from stage s+1 here (-1: none)
)
COL = {name: i for i, name in enumerate(COLUMNS)}


@dataclass(frozen=True)
class Op:
    kind: int  # FORWARD or BACKWARD
    microbatch: int
    chunk: int  # global chunk index c in model order


@dataclass
class Schedule:
    """A timed schedule.

    Attributes:
      name, stages (p), microbatches (M), virtual_stages (V).
      orders: per stage, its operations in execution order.
      timeline: ``timeline[t][s]`` is the :class:`Op` stage ``s`` runs at tick ``t`` (or None).
      table: ``int32 [T, p, len(COLUMNS)]``, what the executor indexes (see ``COLUMNS``).
      slots: how many residual, activation-inbox and gradient-inbox slots each stage allocates.
      peak_alive: per stage, the most microbatch-chunks whose residuals were alive at once.
    """

    name: str
    stages: int
    microbatches: int
    virtual_stages: int
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

    def branch_counts(self, stage: int) -> list[int]:
        """How many ticks stage ``stage`` runs each of :data:`BRANCHES`."""
        column = self.table[:, stage, COL["branch"]]
        return [int((column == i).sum()) for i in range(len(BRANCHES))]

    def busy_ticks(self, stage: int) -> int:
        return sum(1 for row in self.timeline if row[stage] is not None)

    def idle_fraction(self) -> float:
        """Fraction of stage-ticks with no work (the pipeline bubble), over all stages."""
        busy = sum(self.busy_ticks(s) for s in range(self.stages))
        return 1.0 - busy / (self.ticks * self.stages)

    def formula_bubble(self) -> float:
        """The closed form: ``(p−1)/(V·M+p−1)`` (V = 1 for GPipe and 1F1B)."""
        p, m, v = self.stages, self.microbatches, self.virtual_stages
        return (p - 1) / (v * m + p - 1)

    def render(self) -> str:
        """The timeline as text, a row per stage: ``F3``/``B3`` (``F3.1``: chunk 1), ``.`` idle."""
        width = 4 if self.virtual_stages == 1 else 6
        lines = []
        for s in range(self.stages):
            cells = []
            for row in self.timeline:
                op = row[s]
                if op is None:
                    cells.append(".".center(width))
                    continue
                tag = ("F" if op.kind == FORWARD else "B") + str(op.microbatch)
                if self.virtual_stages > 1:
                    tag += f".{op.chunk // self.stages}"
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
    if not pipeline_schedule(name).virtual and v != 1:
        virtual = "|".join(TABLE.names(lambda schedule: schedule.virtual))
        raise ValueError(f"--virtual-stages {v} needs --pipeline {virtual}")
    orders = stage_orders(name, p, m, v)
    timeline = _simulate(orders, p, m, v)
    table, slots, peak = _allocate(timeline, p, v)
    return Schedule(name, p, m, v, orders, timeline, table, slots, peak)


def _simulate(orders: list[list[Op]], p: int, m: int, v: int) -> list[list[Op | None]]:
    last = p * v - 1
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
            if op.kind == FORWARD:
                dep = None if op.chunk == 0 else (FORWARD, op.microbatch, op.chunk - 1)
            elif op.chunk == last:
                dep = (FORWARD, op.microbatch, op.chunk)
            else:
                dep = (BACKWARD, op.microbatch, op.chunk + 1)
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


def _branch(op: Op, last: int) -> int:
    if op.kind == FORWARD:
        if op.chunk == 0:
            return BRANCH["forward_embed"]
        return BRANCH["forward_head"] if op.chunk == last else BRANCH["forward"]
    return BRANCH["backward_embed"] if op.chunk == 0 else BRANCH["backward"]


class _Slots:
    """First-free slot allocator."""

    def __init__(self) -> None:
        self.used: set[int] = set()
        self.peak = 0

    def take(self) -> int:
        i = 0
        while i in self.used:
            i += 1
        self.used.add(i)
        self.peak = max(self.peak, len(self.used))
        return i

    def free(self, i: int) -> None:
        self.used.remove(i)


def _allocate(
    timeline: list[list[Op | None]], p: int, v: int
) -> tuple[np.ndarray, dict[str, int], list[int]]:
    last = p * v - 1
    n_ticks = len(timeline)
    table = np.full((n_ticks, p, len(COLUMNS)), -1, dtype=np.int32)
    table[:, :, COL["op"]] = IDLE
    table[:, :, COL["branch"]] = BRANCH["idle"]
    table[:, :, COL["microbatch"]] = 0
    table[:, :, COL["chunk"]] = 0
    res = [_Slots() for _ in range(p)]
    fin = [_Slots() for _ in range(p)]
    bin_ = [_Slots() for _ in range(p)]
    res_at: list[dict[tuple[int, int], int]] = [{} for _ in range(p)]
    fin_at: list[dict[tuple[int, int], int]] = [{} for _ in range(p)]
    bin_at: list[dict[tuple[int, int], int]] = [{} for _ in range(p)]
    for t, row in enumerate(timeline):
        # 1. operations read and free their slots
        for s, op in enumerate(row):
            if op is None:
                continue
            cell = table[t, s]
            cell[COL["op"]] = op.kind
            cell[COL["branch"]] = _branch(op, last)
            cell[COL["microbatch"]] = op.microbatch
            cell[COL["chunk"]] = op.chunk // p
            key = (op.microbatch, op.chunk)
            if op.kind == FORWARD:
                if op.chunk > 0:
                    slot = fin_at[s].pop(key)
                    fin[s].free(slot)
                    cell[COL["input_slot"]] = slot
                cell[COL["residual_slot"]] = res_at[s][key] = res[s].take()
                if op.chunk == last:  # the loss head's gradient waits for this chunk's backward
                    cell[COL["grad_slot"]] = bin_at[s][key] = bin_[s].take()
            else:
                slot = res_at[s].pop(key)
                res[s].free(slot)
                cell[COL["residual_slot"]] = slot
                gslot = bin_at[s].pop(key)
                bin_[s].free(gslot)
                cell[COL["grad_slot"]] = gslot
        # 2. messages sent this tick arrive at the neighbours
        for s, op in enumerate(row):
            if op is None:
                continue
            if op.kind == FORWARD and op.chunk < last:
                dst, key = (s + 1) % p, (op.microbatch, op.chunk + 1)
                table[t, dst, COL["arrive_fwd_slot"]] = fin_at[dst][key] = fin[dst].take()
            if op.kind == BACKWARD and op.chunk > 0:
                dst, key = (s - 1) % p, (op.microbatch, op.chunk - 1)
                table[t, dst, COL["arrive_bwd_slot"]] = bin_at[dst][key] = bin_[dst].take()
    slots = {
        "residual": max(a.peak for a in res),
        "activation": max(1, max(a.peak for a in fin)),
        "gradient": max(a.peak for a in bin_),
    }
    return table, slots, [a.peak for a in res]
