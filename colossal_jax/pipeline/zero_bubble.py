"""Zero-bubble orders (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
split into **B** (the activation gradient, on the critical path) and **W** (the weight gradient,
which only its own B must precede), so W fills the bubbles. Both orders are made in unit time
(every operation one tick), which :func:`colossal_jax.pipeline.schedule.simulate` then times
again (the same timeline).

- **ZB-H1** (:func:`zb_h1_order`): every stage runs 1F1B's order of F and B; whenever that
  order's next operation cannot run — its input has not arrived, or an F would make more than
  ``p`` microbatches alive on the stage (``F − W ≤ p``: a microbatch lives from its F to its W,
  and ``p`` is 1F1B's peak, on stage 0) — the stage runs its oldest pending W instead; the W's
  left over follow the last B. With unit F, B and W the bubble is ``p − 1`` ticks against
  1F1B's ``3(p − 1)`` (a third) for ``M ≥ p``, with ``p`` records alive on every stage.
- **ZB-V** (:func:`zb_v_order`): two chunks per stage in a V — stage ``s`` holds chunks ``s``
  and ``2p − 1 − s``, so the first stage also runs the last chunk and the loss — from a greedy
  list scheduler (:func:`greedy_order`). On each stage and tick it runs, of the operations whose
  input arrived in an earlier tick: a **B** (the lowest microbatch, then the latest chunk); else
  an **F** while ``F − W < 2p`` half-stage chunks (1F1B's peak, ``p`` whole-stage microbatches);
  else the oldest **W**; else nothing.
"""

from __future__ import annotations

import heapq

from colossal_jax.pipeline.schedule import (
    BACKWARD,
    FORWARD,
    WEIGHT,
    Op,
    dependency,
    one_f_one_b_order,
    place,
)


def zb_h1_order(p: int, m: int, v: int = 1) -> list[list[Op]]:
    """ZB-H1: 1F1B's order of F and B on every stage, a W wherever that order waits (module
    docstring); at most ``p`` microbatches alive (F to W) on any stage."""
    if v != 1:
        raise ValueError(f"ZB-H1 runs one chunk per stage, got {v}")
    fb = one_f_one_b_order(p, m)
    last = p - 1
    pos = [0] * p
    weights: list[list[Op]] = [[] for _ in range(p)]  # W's whose B has run, oldest first
    alive = [0] * p  # microbatches past their F and before their W
    done: dict[tuple[int, int, int], int] = {}
    orders: list[list[Op]] = [[] for _ in range(p)]
    t = 0
    while any(pos[s] < len(fb[s]) or weights[s] for s in range(p)):
        ran = []
        for s in range(p):
            op = None
            if pos[s] < len(fb[s]):
                nxt = fb[s][pos[s]]
                dep = dependency(nxt, last)
                arrived = dep is None or done.get(dep, t) < t
                if arrived and not (nxt.kind == FORWARD and alive[s] >= p):
                    op = nxt
                    pos[s] += 1
            if op is None and weights[s]:
                op = weights[s].pop(0)
            if op is not None:
                ran.append((s, op))
        for s, op in ran:
            orders[s].append(op)
            done[(op.kind, op.microbatch, op.chunk)] = t
            alive[s] += {FORWARD: 1, BACKWARD: 0, WEIGHT: -1}[op.kind]
            if op.kind == BACKWARD:
                weights[s].append(Op(WEIGHT, op.microbatch, op.chunk))
        t += 1
        if t > 6 * m * p + 8 * p:
            raise RuntimeError(f"the ZB-H1 order deadlocked at p={p}, M={m}")
    return orders


def zb_v_order(p: int, m: int, v: int = 2) -> list[list[Op]]:
    """ZB-V: chunks ``s`` and ``2p − 1 − s`` on stage ``s``, at most ``2p`` chunk-activations."""
    if v != 2:
        raise ValueError(f"ZB-V runs two chunks per stage (a V), got {v}")
    return greedy_order(p, m, 2, "v", [(2 * m, 2 * m, 2 * p)] * p)


def greedy_order(
    p: int, m: int, v: int, placement: str, limits: list[tuple[int, int, int]]
) -> list[list[Op]]:
    """Each stage's operations in the order the greedy list scheduler (module docstring) runs
    them: B first, then F under the stage's ``(residual, pending, saved)`` ``limits``, then W.
    The ready operations wait in a heap per stage and kind, keyed ``(microbatch, −chunk)``; an
    operation joins its heap the tick after the one it depends on ran (:func:`_unblocked`), so
    a step costs ``O(p log M)``, not a scan of everything pending."""
    last = p * v - 1
    ready: list[dict[int, list]] = [{FORWARD: [], BACKWARD: [], WEIGHT: []} for _ in range(p)]
    for i in range(m):  # the embedding's forwards wait for nothing
        ready[place(0, p, v, placement)[0]][FORWARD].append((i, 0, Op(FORWARD, i, 0)))
    for heaps in ready:
        heapq.heapify(heaps[FORWARD])
    left = [3 * m * sum(place(c, p, v, placement)[0] == s for c in range(p * v)) for s in range(p)]
    count = [{FORWARD: 0, BACKWARD: 0, WEIGHT: 0} for _ in range(p)]  # operations run
    orders: list[list[Op]] = [[] for _ in range(p)]
    t = 0
    while any(left):
        ran = []
        for s in range(p):
            f, b, w = count[s][FORWARD], count[s][BACKWARD], count[s][WEIGHT]
            residual, waiting, saved = limits[s]
            may_forward = f - b < residual and b - w < waiting and f - w < saved
            for kind in (BACKWARD, FORWARD, WEIGHT):
                heap = ready[s][kind]
                if heap and (kind != FORWARD or may_forward):
                    ran.append((s, heapq.heappop(heap)[2]))
                    break
        for s, op in ran:
            left[s] -= 1
            orders[s].append(op)
            count[s][op.kind] += 1
            for nxt in _unblocked(op, last):
                heapq.heappush(
                    ready[place(nxt.chunk, p, v, placement)[0]][nxt.kind],
                    (nxt.microbatch, -nxt.chunk, nxt),
                )
        t += 1
        if t > 8 * m * v * p + 8 * p:
            raise RuntimeError(f"the greedy zero-bubble order deadlocked at p={p}, M={m}")
    return orders


def _unblocked(op: Op, last: int) -> list[Op]:
    """The operations whose :func:`~colossal_jax.pipeline.schedule.dependency` is ``op``."""
    i, c = op.microbatch, op.chunk
    if op.kind == FORWARD:
        return [Op(FORWARD, i, c + 1)] if c < last else [Op(BACKWARD, i, c)]
    if op.kind == BACKWARD:
        return [Op(WEIGHT, i, c)] + ([Op(BACKWARD, i, c - 1)] if c > 0 else [])
    return []
