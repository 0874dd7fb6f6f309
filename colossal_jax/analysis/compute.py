"""What a compiled XLA program computes and copies: the FLOPs of its matmuls with loop trip
counts (XLA's ``cost_analysis`` counts a loop body once), and the bytes each ``while`` loop copies
per iteration. The collectives and their bytes are :mod:`colossal_jax.analysis.hlo`'s, whose
parsing of the HLO text (computations, calls, branches, trip counts) this module shares.

Usage::

    text = jax.jit(f).lower(*args).compile().as_text()
    matmul_flops(text), while_loops(text)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from colossal_jax.analysis.hlo import (
    ARRAY,
    BRANCHES,
    CALLS,
    TRIP,
    array_bytes,
    split_computations,
)

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\S+?\[[0-9,]*\])")
_PARAM = re.compile(r"^\s*%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\S+?\[[0-9,]*\])\S*\s+parameter\(")
_DOT = re.compile(r"\bdot\(%?(?P<lhs>[\w.\-]+),\s*%?(?P<rhs>[\w.\-]+)\)")
_LHS_CONTRACT = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")


def _dims(type_text: str) -> list[int]:
    m = ARRAY.search(type_text)
    if not m or not m.group(2):
        return []
    return [int(d) for d in m.group(2).split(",")]


def matmul_flops(hlo_text: str, branch_counts: dict[int, list[int]] | None = None) -> float:
    """FLOPs of every ``dot`` a device executes in one run of a compiled module (2 per
    multiply-add), following fusions and calls, multiplying ``while`` bodies by their trip count.

    XLA's own ``cost_analysis()`` counts a loop body once and a conditional as its most costly
    branch. Here a conditional with ``n`` branches, where ``branch_counts[n]`` is given, runs
    branch ``i`` on ``branch_counts[n][i]`` of every ``sum(branch_counts[n])`` of its runs (the
    pipeline's tick switch inside the tick loop: the counts come from the tick table); other
    conditionals count their costliest branch, as XLA does.
    """
    comps, entry = split_computations(hlo_text)
    if entry is None:
        return 0.0
    shapes: dict[str, dict[str, list[int]]] = {}
    for name, lines in comps.items():
        table: dict[str, list[int]] = {}
        for line in lines:
            m = _INSTR.match(line) or _PARAM.match(line)
            if m:
                table[m.group("name")] = _dims(m.group("type"))
        shapes[name] = table
    cache: dict[str, float] = {}

    def cost(name: str, stack: tuple[str, ...]) -> float:
        if name in cache:
            return cache[name]
        if name in stack or name not in comps:
            return 0.0
        total = 0.0
        for line in comps[name]:
            dot = _DOT.search(line)
            inst = _INSTR.match(line)
            if dot and inst:
                out = _dims(inst.group("type"))
                lhs = shapes[name].get(dot.group("lhs"), [])
                contract = _LHS_CONTRACT.search(line)
                k = 1
                if contract and contract.group(1):
                    for d in contract.group(1).split(","):
                        k *= lhs[int(d)] if int(d) < len(lhs) else 1
                n_out = 1
                for d in out:
                    n_out *= d
                total += 2.0 * n_out * k
            if "-done(" in line:
                continue
            branches = []
            for group in BRANCHES.findall(line):
                branches += [c.strip().lstrip("%") for c in group.split(",") if c.strip()]
            if branches:
                costs = [cost(b, (*stack, name)) for b in branches]
                counts = (branch_counts or {}).get(len(branches))
                if counts is not None:  # branch i on counts[i] of the conditional's runs
                    runs = max(1, sum(counts))
                    total += sum(c * n for c, n in zip(costs, counts, strict=True)) / runs
                else:
                    total += max(costs)
                continue
            called = CALLS.findall(line)
            inner = 1.0
            if " while(" in line:
                trip = TRIP.search(line)
                inner = float(trip.group(1)) if trip else 1.0
                called = [c for c in called if c != _condition_of(line)]
            total += inner * sum(cost(c, (*stack, name)) for c in called)
        cache[name] = total
        return total

    return cost(entry, ())


def _condition_of(line: str) -> str | None:
    m = re.search(r"\bcondition=%?([\w.\-]+)", line)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Loop:
    """One ``while`` loop of a program: its known trip count (None if XLA states none), the bytes
    of its carry, and the bytes its body copies per iteration (its ``copy`` instructions)."""

    trip_count: int | None
    carry_bytes: float
    copied_bytes: float


def while_loops(hlo_text: str) -> list[Loop]:
    """Every ``while`` loop in ``hlo_text`` with its carry and the bytes its body copies per
    iteration: a loop that copies most of its carry at every iteration (a buffer XLA could not
    update in place) shows here."""
    comps, _ = split_computations(hlo_text)
    loops = []
    for lines in comps.values():
        for line in lines:
            if " while(" not in line:
                continue
            body = re.search(r"\bbody=%?([\w.\-]+)", line)
            trip = TRIP.search(line)
            carry = sum(array_bytes(line.split("=", 1)[1].split(" while(")[0]))
            copied = 0.0
            for inner in comps.get(body.group(1), []) if body else []:
                if " copy(" in inner:
                    copied += sum(array_bytes(inner.split("=", 1)[1].split(" copy(")[0]))
            loops.append(Loop(int(trip.group(1)) if trip else None, carry, copied))
    return loops
