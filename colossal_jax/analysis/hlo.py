"""Read the collectives of a compiled XLA program and the bytes each device moves (ring model).

Per device, for one collective over a replica group of n devices (the ring model of
docs/formulas.md, §1):

| HLO op | bytes received per device |
|---|---|
| all-gather, result R | R·(n−1)/n |
| reduce-scatter, result r (operand r·n) | r·(n−1) |
| all-reduce of S | 2·S·(n−1)/n |
| all-to-all of S | S·(n−1)/n |
| collective-permute of S | S |

A collective-permute is counted by what it sends, whichever form it takes: one operand, a
combined permute of several (a tuple, every element travels), or an async
``collective-permute-start`` (its type is ``(operand, result, context…)``: the result counts).
Collective-matmul rings (:mod:`colossal_jax.tensor.collective_matmul`) are ``n − 1`` such
permutes of one block each.

Ops inside called computations (fusions, async wrappers, conditionals) are followed, and ops
inside a ``while`` body are multiplied by the loop's ``known_trip_count`` — ring attention's
permutes live in such a loop. ``-done`` halves of async pairs are skipped (the ``-start`` is
counted once).

Usage::

    compiled = jax.jit(f).lower(*args).compile()
    report = analyze(compiled.as_text())
    report.total_bytes, report.by_op()
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

COLLECTIVES = (
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "all-to-all",
    "collective-permute",
)

_OP = re.compile(
    r"=\s*(?P<type>.+?)\s+(?P<op>all-gather-start|all-gather|all-reduce-start|all-reduce|"
    r"reduce-scatter-start|reduce-scatter|all-to-all|collective-permute-start|"
    r"collective-permute)\("
)
ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9]\w*)?)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
CALLS = re.compile(
    r"\b(?:calls|body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_GROUPS_LIST = re.compile(r"replica_groups=\{(\{[^=]*?\})\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_PAIRS = re.compile(r"source_target_pairs=\{([^=]*?)\}(?:,|\s|$)")
_PARTITIONS = re.compile(r"num_partitions=(\d+)")
_COMMENT = re.compile(r"/\*.*?\*/")


def _dtype_bytes(dtype: str) -> float:
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    if dtype.startswith("f8"):
        return 1
    raise ValueError(f"unknown HLO element type {dtype!r}")


def array_bytes(type_text: str) -> list[float]:
    """Byte sizes of the arrays in an HLO type (``f32[2,3]{1,0}`` or a tuple of them)."""
    sizes = []
    for dtype, dims in ARRAY.findall(type_text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        sizes.append(n * _dtype_bytes(dtype))
    return sizes


@dataclass(frozen=True)
class Collective:
    """One collective op, executed ``count`` times per program run (a fraction of a loop's
    trips inside a conditional whose branch frequencies were given)."""

    op: str
    group_size: int
    result_bytes: float
    count: float
    computation: str

    @property
    def moved_bytes(self) -> float:
        """Bytes received per device, per execution (ring model)."""
        n, size = self.group_size, self.result_bytes
        if n <= 1:
            return 0.0
        if self.op == "all-gather":
            return size * (n - 1) / n
        if self.op == "reduce-scatter":
            return size * (n - 1)
        if self.op == "all-reduce":
            return 2 * size * (n - 1) / n
        if self.op == "all-to-all":
            return size * (n - 1) / n
        if self.op == "collective-permute":
            return size
        raise ValueError(f"not a collective: {self.op}")

    @property
    def total_bytes(self) -> float:
        return self.moved_bytes * self.count


@dataclass
class Report:
    collectives: list[Collective] = field(default_factory=list)
    unknown_trip_counts: int = 0

    @property
    def total_bytes(self) -> float:
        return sum(c.total_bytes for c in self.collectives)

    def by_op(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for c in self.collectives:
            out[c.op] += c.total_bytes
        return dict(out)

    def count_by_op(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[c.op] += c.count
        return dict(out)


def _group_size(line: str, op: str, n_partitions: int) -> int:
    if op == "collective-permute":
        return 2  # a permute moves its whole operand; n only has to exceed 1
    m = _GROUPS_IOTA.search(line)
    if m:
        return int(m.group(2))
    m = _GROUPS_LIST.search(line)
    if m:
        first = m.group(1).split("}")[0].strip("{ ")
        return len([t for t in first.split(",") if t.strip()])
    return n_partitions  # replica_groups={} : one group of every device


def _result_bytes(type_text: str, op_text: str) -> float:
    sizes = array_bytes(type_text)
    if not sizes:
        return 0.0
    if op_text == "all-gather-start":
        return sizes[-1]  # (operand, result)
    if op_text == "collective-permute-start":
        # (operand, result, ctx...); a combined permute's operand and result are tuples
        parts = _tuple_elements(type_text)
        return sum(array_bytes(parts[1] if len(parts) > 1 else parts[0]))
    if op_text in ("all-reduce-start", "all-to-all", "all-reduce"):
        return sum(sizes)  # tuple all-reduce / all-to-all: every operand travels
    return sizes[-1] if op_text.endswith("-start") else sum(sizes)


def _tuple_elements(type_text: str) -> list[str]:
    """The top-level elements of an HLO tuple type (``[type_text]`` for an array type)."""
    text = type_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                parts.append(text[start:i])
                break
        elif ch == "," and depth == 1:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in parts if p.strip()]


def split_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """``(computation name -> its instruction lines, the entry computation's name)``."""
    comps: dict[str, list[str]] = {}
    entry = None
    current: list[str] | None = None
    for raw in text.splitlines():
        line = _COMMENT.sub("", raw)
        m = _HEADER.match(line.strip())
        if m and current is None:
            name = m.group("name")
            current = comps.setdefault(name, [])
            if line.lstrip().startswith("ENTRY"):
                entry = name
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                current.append(line)
    return comps, entry


def analyze(hlo_text: str, branch_counts: dict[int, list[int]] | None = None) -> Report:
    """Every collective of a compiled module, with loop multiplicities (``branch_counts``: as
    :func:`matmul_flops`'s; without it every branch of a conditional counts every run)."""
    report = Report()
    for collective, _ in _walk(hlo_text, report, branch_counts):
        report.collectives.append(collective)
    return report


def collective_lines(
    hlo_text: str, branch_counts: dict[int, list[int]] | None = None
) -> list[tuple[Collective, str]]:
    """Every collective of a compiled module (as :func:`analyze`) with its HLO line, whose
    ``replica_groups`` / ``source_target_pairs`` :func:`device_groups` reads."""
    return list(_walk(hlo_text, Report(), branch_counts))


def _walk(
    hlo_text: str, report: Report, branch_counts: dict[int, list[int]] | None = None
) -> list[tuple[Collective, str]]:
    """The collectives reached from the entry computation, each with its line; loops of unknown
    trip count are counted in ``report.unknown_trip_counts``. A conditional with ``n``
    branches, where ``branch_counts[n]`` is given, runs branch ``i`` on ``branch_counts[n][i]``
    of every ``sum(branch_counts[n])`` of its runs."""
    comps, entry = split_computations(hlo_text)
    m = _PARTITIONS.search(hlo_text)
    n_partitions = int(m.group(1)) if m else 1
    found: list[tuple[Collective, str]] = []
    if entry is None:
        return found

    def visit(name: str, mult: float, stack: tuple[str, ...]) -> None:
        if name in stack or name not in comps:
            return
        for line in comps[name]:
            op_match = _OP.search(line)
            if op_match:
                op_text = op_match.group("op")
                op = op_text.removesuffix("-start")
                collective = Collective(
                    op=op,
                    group_size=_group_size(line, op, n_partitions),
                    result_bytes=_result_bytes(op_match.group("type"), op_text),
                    count=mult,
                    computation=name,
                )
                found.append((collective, line))
            if "-done(" in line or " async-done(" in line or "async-update(" in line:
                continue
            called = CALLS.findall(line)
            branches = []
            for branch in BRANCHES.findall(line):
                branches += [c.strip().lstrip("%") for c in branch.split(",") if c.strip()]
            inner = mult
            if " while(" in line:
                trip = TRIP.search(line)
                if trip:
                    inner = mult * int(trip.group(1))
                else:
                    report.unknown_trip_counts += 1
            for c in called:
                visit(c, inner, (*stack, name))
            counts = (branch_counts or {}).get(len(branches)) if branches else None
            for i, c in enumerate(branches):
                share = counts[i] / max(1, sum(counts)) if counts is not None else 1.0
                visit(c, inner * share, (*stack, name))

    visit(entry, 1, ())
    return found


_PAIR_LIST = re.compile(r"source_target_pairs=\{((?:\{[0-9,\s]*\},?\s*)*)\}")
_IOTA_FULL = re.compile(
    r"replica_groups=\[(?P<shape>[0-9,]+)\]<=\[(?P<dims>[0-9,]+)\](?:T\((?P<perm>[0-9,]+)\))?"
)


def device_groups(line: str, n_devices: int) -> list[list[int]]:
    """The groups of device (partition) ids one collective's HLO ``line`` runs over: its
    ``replica_groups`` as a list (``{{0,1},{2,3}}``) or in iota form (``[2,4]<=[4,2]T(1,0)``:
    ``arange(8).reshape(4, 2).transpose(1, 0).reshape(2, 4)``), all ``n_devices`` for an empty
    list, and for a collective-permute the connected components of its
    ``source_target_pairs`` (devices it leaves out are not in any group)."""
    pairs = _PAIR_LIST.search(line)
    if pairs is not None and "collective-permute" in line:
        return _components(_int_lists(pairs.group(1)))
    m = _IOTA_FULL.search(line)
    if m:
        return _iota_groups(m.group("shape"), m.group("dims"), m.group("perm"))
    m = _GROUPS_LIST.search(line)
    if m:
        return _int_lists(m.group(1))
    return [list(range(n_devices))]


def _int_lists(text: str) -> list[list[int]]:
    """``{0,1},{2,3}`` → ``[[0, 1], [2, 3]]``."""
    return [
        [int(t) for t in part.split(",") if t.strip()]
        for part in re.findall(r"\{([0-9,\s]*)\}", text)
    ]


def _iota_groups(shape: str, dims: str, perm: str | None) -> list[list[int]]:
    """The groups of an iota ``replica_groups=[shape]<=[dims]T(perm)``."""
    dim_list = [int(d) for d in dims.split(",")]
    ids: list = list(range(_prod(dim_list)))
    if perm:
        order = [int(p) for p in perm.split(",")]
        strides = [_prod(dim_list[i + 1 :]) for i in range(len(dim_list))]
        new_dims = [dim_list[p] for p in order]
        ids = []
        for flat in range(_prod(new_dims)):
            index, rest = [0] * len(new_dims), flat
            for axis in reversed(range(len(new_dims))):
                index[axis], rest = rest % new_dims[axis], rest // new_dims[axis]
            ids.append(sum(index[k] * strides[order[k]] for k in range(len(order))))
    size = [int(d) for d in shape.split(",")][-1]
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _components(pairs: list[list[int]]) -> list[list[int]]:
    """The connected components of the devices a permute's ``(source, target)`` pairs join."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for pair in pairs:
        a, b = root(pair[0]), root(pair[-1])
        parent[a] = b
    groups: dict[int, list[int]] = defaultdict(list)
    for x in sorted(parent):
        groups[root(x)].append(x)
    return list(groups.values())


def bytes_moved(hlo_text: str, branch_counts: dict[int, list[int]] | None = None) -> float:
    """Total bytes received per device by every collective of one program run
    (``branch_counts``: as :func:`analyze`)."""
    return analyze(hlo_text, branch_counts).total_bytes
