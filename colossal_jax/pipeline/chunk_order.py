"""The stack's chunks moved between model order and chunk order over ``pipe``, point to point.

In model order the stack's layer axis is split contiguously over ``pipe``: stage ``d`` holds
model chunks ``d·V … d·V + V − 1``. A schedule with ``V > 1`` chunks per stage runs chunk ``c``
on stage ``place(c)`` (interleaved: ``c mod p``; ZB-V: ``c`` and ``2p − 1 − c``). Such a run
keeps its state **in chunk order** between steps (:mod:`colossal_jax.training.stack_order`), so
a step moves nothing; the exchange runs only where model order is needed (a checkpoint saved,
the state handed back, a plain forward) and where it comes back.

Algorithm: the moves form a ``V``-regular bipartite multigraph (every stage sends ``V`` chunks
and receives ``V``), which König's edge-colouring theorem splits into ``V`` perfect matchings;
each matching is one ``ppermute`` of one chunk per device (a chunk whose source and target stage
agree is a local copy and sends nothing). The way back takes the same rounds backwards.

Cost per device and exchange: the stage's chunks that run elsewhere, sent and received — at most
the stage's whole stack (interleaved at ``p = V = 2``: one chunk of two; at ``p = 4, V = 2``
stage 0 keeps chunk 0 and stage 1 keeps none), in ``V`` ``ppermute`` rounds; memory: one chunk
in flight and the reordered copy of the stage's blocks. (Indexing the whole stack with the
permutation instead lets XLA gather the stack on every stage: ``p`` times the bytes and the
memory.)
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from colossal_jax.layers.stack import is_stacked
from colossal_jax.parallel.sharding import is_variable
from colossal_jax.pipeline.schedule import Schedule

AXIS = "pipe"


@dataclass(frozen=True)
class Round:
    """One matching: stage ``d`` sends its stored local chunk ``src_local[d]`` to stage
    ``dst[d]``, which files it as its chunk-order local chunk ``dst_local[dst[d]]``."""

    src_local: tuple[int, ...]
    dst: tuple[int, ...]
    dst_local: tuple[int, ...]

    @property
    def source(self) -> tuple[int, ...]:
        """``source[e]``: the stage whose chunk stage ``e`` receives in this round."""
        out = [0] * len(self.dst)
        for d, e in enumerate(self.dst):
            out[e] = d
        return tuple(out)


def moves(schedule: Schedule) -> list[tuple[int, int, int, int]]:
    """Every chunk's move ``(from stage, stored local, to stage, chunk-order local)``."""
    p, v = schedule.stages, schedule.virtual_stages
    out = []
    for c in range(p * v):
        s, local = divmod(c, v)
        to = schedule.stage_of(c)
        out.append((s, local, to, next(j for j in range(v) if schedule.chunk_at(to, j) == c)))
    return out


def rounds(schedule: Schedule) -> list[Round]:
    """The moves split into ``V`` perfect matchings (augmenting paths, one matching at a time:
    a regular bipartite multigraph always has one)."""
    p = schedule.stages
    left = moves(schedule)
    out = []
    while left:
        chosen = sorted(_perfect_matching(left, p))
        for mv in chosen:
            left.remove(mv)
        src_local, dst, dst_local = [0] * p, [0] * p, [0] * p
        for s, local, to, to_local in chosen:
            src_local[s], dst[s], dst_local[to] = local, to, to_local
        out.append(Round(tuple(src_local), tuple(dst), tuple(dst_local)))
    return out


def _perfect_matching(edges: list[tuple[int, int, int, int]], p: int) -> list:
    """One move from every stage to every stage (Kuhn's augmenting paths)."""
    match: dict[int, tuple[int, int, int, int]] = {}  # target stage -> move

    def augment(d: int, seen: set[int]) -> bool:
        for mv in edges:
            if mv[0] != d or mv[2] in seen:
                continue
            seen.add(mv[2])
            holder = match.get(mv[2])
            if holder is None or augment(holder[0], seen):
                match[mv[2]] = mv
                return True
        return False

    for d in range(p):
        if not augment(d, set()):
            raise RuntimeError(f"no perfect matching of the chunk moves at stage {d}")
    return list(match.values())


def sent_chunks(schedule: Schedule) -> int:
    """The most chunks any stage sends one way (its moves to another stage)."""
    per = [0] * schedule.stages
    for s, _, to, _ in moves(schedule):
        per[s] += s != to
    return max(per)


def _exchange(tree, plan: list[tuple[tuple, tuple, tuple]], v: int):
    """Per device inside a ``shard_map`` over ``pipe``: for each ``(read, send_to, write)`` round
    read local chunk ``read[me]``, send it to ``send_to[me]`` and file what arrives at
    ``write[me]``."""
    me = jax.lax.axis_index(AXIS)

    def one(a):
        blocks = a.reshape(v, a.shape[0] // v, *a.shape[1:])
        out = jnp.zeros_like(blocks)
        for read, send_to, write in plan:
            piece = jax.lax.dynamic_index_in_dim(blocks, jnp.asarray(read)[me], keepdims=False)
            pairs = [(d, e) for d, e in enumerate(send_to) if d != e]
            got = piece
            if pairs:
                moved = jax.lax.ppermute(piece, AXIS, pairs)
                from_self = jnp.asarray([send_to[e] == e for e in range(len(send_to))])[me]
                got = jnp.where(from_self, piece, moved)
            out = jax.lax.dynamic_update_index_in_dim(out, got, jnp.asarray(write)[me], 0)
        return out.reshape(a.shape)

    return jax.tree.map(one, tree)


def to_chunk_order(tree, schedule: Schedule):
    """The stage's stored (model-order) stack blocks as its chunk-order blocks (per device)."""
    plan = [(r.src_local, r.dst, r.dst_local) for r in rounds(schedule)]
    return _exchange(tree, plan, schedule.virtual_stages)


def to_model_order(tree, schedule: Schedule):
    """The inverse of :func:`to_chunk_order` (per device): chunk-order blocks, e.g. the stack's
    gradient, back to the stage's stored model-order blocks."""
    plan = [(r.dst_local, r.source, r.src_local) for r in rounds(schedule)]
    return _exchange(tree, plan, schedule.virtual_stages)


def permutation(n_layer: int, schedule: Schedule) -> np.ndarray:
    """The same move as one layer permutation of the whole stack, ``chunk_ordered[j] =
    model[perm[j]]`` (the reference the exchange is tested against)."""
    p, v = schedule.stages, schedule.virtual_stages
    per_chunk = n_layer // (p * v)
    perm = [
        schedule.chunk_at(s, local) * per_chunk + i
        for s in range(p)
        for local in range(v)
        for i in range(per_chunk)
    ]
    return np.asarray(perm, dtype=np.int32)


def exchange_stacked(
    tree, shardings, schedule: Schedule, *, to_chunks: bool, device_shardings=None
):
    """Inside a jit: every stacked (layer-axis) Variable of ``tree`` — parameters, or an
    optimizer state holding them — moved between model order and chunk order over ``pipe``
    (``to_chunks``: model → chunk order); other leaves unchanged. ``shardings`` are the tree's
    NamedShardings (``device_shardings``: where it computes, when ``shardings`` are in the
    host's memory)."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_variable)
    where = treedef.flatten_up_to(shardings)
    compute = where if device_shardings is None else treedef.flatten_up_to(device_shardings)
    picked = [i for i, leaf in enumerate(leaves) if is_variable(leaf) and is_stacked(leaf)]
    if not picked:
        return tree
    arrays = [leaves[i].get_value() for i in picked]
    arrays = [
        a if compute[i] == where[i] else jax.device_put(a, compute[i])
        for a, i in zip(arrays, picked, strict=True)
    ]
    specs = [compute[i].spec for i in picked]
    move = to_chunk_order if to_chunks else to_model_order
    moved = jax.shard_map(
        lambda xs: move(xs, schedule),
        mesh=compute[picked[0]].mesh,
        in_specs=(specs,),
        out_specs=specs,
    )(arrays)
    for i, a in zip(picked, moved, strict=True):
        if compute[i] != where[i]:
            a = jax.device_put(a, where[i])
        leaves[i] = leaves[i].replace(a)
    return treedef.unflatten(leaves)
