"""Zero-bubble orders (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
split into **B** (the activation gradient, on the critical path) and **W** (the weight gradient,
which only its own B must precede), so W fills the bubbles.

Both orders come from one greedy list scheduler in unit time (every operation one tick), which
:func:`colossal_jax.pipeline.schedule.simulate` then times again (the same timeline). On each
stage and tick it runs, of the operations whose input arrived in an earlier tick:

1. a **B** (the critical path; the lowest microbatch, then the latest chunk);
2. else an **F**, while the stage's memory limits allow: ``(F − B) < residual_limit`` (the
   chunk's backward residuals live from its F to its B) and ``(B − W) < pending_limit`` (the
   linears' output gradients live from the B to the W) and ``(F − W) < saved_limit`` (the
   linears' inputs live from the F to the W);
3. else a **W** (the oldest B first) — the bubbles 1F1B leaves idle;
4. else nothing.

- **ZB-H1**: one chunk per stage, stage ``s`` on chunk ``s``; ``residual_limit = p − s`` (1F1B's
  residuals) and ``pending_limit = p`` W's waiting. 1F1B's warm-up, and the W deferred into the
  cool-down's bubbles: with unit F, B and W the bubble is ``p − 1`` ticks against 1F1B's
  ``3(p − 1)`` (a third); the price is up to ``p`` sets of the linears' output gradients and
  ``2p − 1`` sets of their inputs alive on stage 0 (the table's ``slots``).
- **ZB-V**: two chunks per stage in a V — stage ``s`` holds chunks ``s`` and ``2p − 1 − s``, so
  the first stage also runs the last chunk and the loss — and ``saved_limit = 2p`` half-stage
  chunks, 1F1B's peak (``p`` whole-stage microbatches) on every stage.
"""

from __future__ import annotations

from colossal_jax.pipeline.schedule import BACKWARD, FORWARD, WEIGHT, Op, dependency, place


def zb_h1_order(p: int, m: int, v: int = 1) -> list[list[Op]]:
    """ZB-H1: 1F1B's warm-up and memory (``p − s`` microbatches on stage ``s``), W deferred."""
    if v != 1:
        raise ValueError(f"ZB-H1 runs one chunk per stage, got {v}")
    return greedy_order(p, m, 1, "loop", [(p - s, p, 2 * m) for s in range(p)])


def zb_v_order(p: int, m: int, v: int = 2) -> list[list[Op]]:
    """ZB-V: chunks ``s`` and ``2p − 1 − s`` on stage ``s``, at most ``2p`` chunk-activations."""
    if v != 2:
        raise ValueError(f"ZB-V runs two chunks per stage (a V), got {v}")
    return greedy_order(p, m, 2, "v", [(2 * m, 2 * m, 2 * p)] * p)


def greedy_order(
    p: int, m: int, v: int, placement: str, limits: list[tuple[int, int, int]]
) -> list[list[Op]]:
    """Each stage's operations in the order the greedy list scheduler (module docstring) runs
    them: B first, then F under the stage's ``(residual, pending, saved)`` ``limits``, then W."""
    last = p * v - 1
    local = [[c for c in range(p * v) if place(c, p, v, placement)[0] == s] for s in range(p)]
    pending = [
        {Op(kind, i, c) for i in range(m) for c in local[s] for kind in (FORWARD, BACKWARD, WEIGHT)}
        for s in range(p)
    ]
    done: dict[tuple[int, int, int], int] = {}
    count = [{FORWARD: 0, BACKWARD: 0, WEIGHT: 0} for _ in range(p)]  # operations run
    orders: list[list[Op]] = [[] for _ in range(p)]
    t = 0
    while any(pending):
        ran = []
        for s in range(p):
            ready = [
                op
                for op in pending[s]
                if (dep := dependency(op, last)) is None or done.get(dep, t) < t
            ]
            f, b, w = count[s][FORWARD], count[s][BACKWARD], count[s][WEIGHT]
            residual, waiting, saved = limits[s]
            op = _pick(ready, f - b < residual and b - w < waiting and f - w < saved)
            if op is not None:
                ran.append((s, op))
        for s, op in ran:
            pending[s].remove(op)
            orders[s].append(op)
            done[(op.kind, op.microbatch, op.chunk)] = t
            count[s][op.kind] += 1
        t += 1
        if t > 8 * m * v * p + 8 * p:
            raise RuntimeError(f"the greedy zero-bubble order deadlocked at p={p}, M={m}")
    return orders


def _pick(ready: list[Op], may_forward: bool) -> Op | None:
    """B (lowest microbatch, latest chunk), else F if memory allows (lowest microbatch, latest
    chunk), else W (lowest microbatch, latest chunk)."""
    for kind in (BACKWARD, FORWARD, WEIGHT):
        if kind == FORWARD and not may_forward:
            continue
        candidates = [op for op in ready if op.kind == kind]
        if candidates:
            return min(candidates, key=lambda op: (op.microbatch, -op.chunk))
    return None
