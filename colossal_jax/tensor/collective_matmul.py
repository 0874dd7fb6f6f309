"""Collective matmul: a collective in front of or behind a matmul, decomposed into a ring of
``ppermute`` steps interleaved with the partial matmuls that consume or produce the block in
flight (Wang et al. 2023, "Overlap Communication with Dependent Computation via Decomposition in
Large Deep Learning Models", ASPLOS '23, doi 10.1145/3567955.3567959).

Run *inside* ``jax.shard_map``. Two schedules over a ring of ``n`` devices along ``axis``, each
``n − 1`` permutes of one block to the next device, written as unrolled Python loops so the
schedule reads top to bottom (and XLA may run each permute under the matmul beside it). A hop is
:func:`colossal_jax.tensor.kernels.ring_shift`, ring attention's: a ``ppermute``, except inside a
pipeline stage's branch, where XLA's CPU runtime would make a collective-permute wait for the
devices of the other stages; there it is an all-to-all (the same bytes at ``n = 2``, ``n − 1``
times the permute's at larger ``n``).

- :func:`ring_all_gather` replaces ``all_gather(x) → matmul``. Step ``s`` multiplies the block a
  device holds (its own at ``s = 0``, then the one it received from its left neighbour) while the
  block moves on. Communication: ``(n−1)`` blocks, as the all-gather's ``R·(n−1)/n``. Memory: two
  blocks in flight instead of the gathered ``R`` (autodiff keeps all ``n`` for the backward pass,
  as it keeps the gathered operand; what XLA allocates is its buffer assignment's choice, see
  docs/performance.md). The transpose of a permute is the permute the other way, so
  ``jax.grad`` of this ring is the reduce-scatter ring below running in reverse: no all-gather.
- :func:`ring_reduce_scatter` replaces ``matmul → psum_scatter``. Step ``s`` computes this
  device's partial product of the block that is ``n − 1 − s`` hops from home, adds it to the
  accumulator received from the left and passes the sum on; after ``n − 1`` permutes each device
  holds its own block, fully summed. Communication: ``(n−1)`` blocks of ``r``, the
  reduce-scatter's ``r·(n−1)``. Memory: one accumulator and one partial block ``r`` instead of
  the ``n·r`` partial product (likewise the algorithm's, not a measured allocation). Its
  transpose is the all-gather ring in reverse.

:func:`matmul_all_reduce` and :func:`column_matmuls` are Megatron 1D's two linears with the
all-reduce written as the reduce-scatter ring followed by an all-gather (same bytes as the
all-reduce, ``2·S·(n−1)/n``). They carry a ``custom_vjp``, because their cotangents are replicated
over the tensor group: the row linear's backward needs no communication at all and the column
linear's backward is one more such all-reduce — autodiff of the rings would instead circulate the
replicated cotangent around the ring again.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import jax.numpy as jnp

from colossal_jax.config.parallel_rules import check_ring_blocks
from colossal_jax.tensor.kernels import ring_shift, varying, varying_axes_of
from colossal_jax.tensor.layout import AxisNames, in_per_stage_branches, per_stage_branches

T = TypeVar("T")
R = TypeVar("R")


def ring_all_gather(x: T, axis: AxisNames, consume: Callable[[T, jax.Array], R]) -> list[R]:
    """``[consume(block_j, j) for every device j of the ring]``, in ring order from this device's
    own block: ``x`` (a pytree of blocks) goes round the ring of ``axis`` and each block is used
    where it arrives (``j``, a traced index, says whose it is)."""
    n = jax.lax.axis_size(axis)
    me = jax.lax.axis_index(axis)
    out = []
    block = x
    for step in range(n):
        incoming = ring_shift(block, axis, n) if step < n - 1 else None
        out.append(consume(block, (me - step) % n))
        block = incoming
    return out


def ring_reduce_scatter(partial: Callable[[jax.Array], T], axis: AxisNames) -> T:
    """``Σ over the devices of the ring of partial(j)`` for this device's own block ``j``:
    ``partial(m)`` (a pytree) is this device's contribution to block ``m``."""
    n = jax.lax.axis_size(axis)
    me = jax.lax.axis_index(axis)
    acc = partial((me - 1) % n)
    for step in range(1, n):
        acc = jax.tree.map(jnp.add, ring_shift(acc, axis, n), partial((me - 1 - step) % n))
    return acc


def block(x: jax.Array, index: jax.Array, size: int, dim: int) -> jax.Array:
    """Block ``index`` (traced) of ``size`` along ``dim``."""
    return jax.lax.dynamic_slice_in_dim(x, index * size, size, axis=dim)


def _all_reduce_by_ring(partial: Callable[[jax.Array], jax.Array], axis: AxisNames, width: int):
    """``psum`` over ``axis`` of a ``[..., width]`` product, as the reduce-scatter ring on its
    last dimension followed by an all-gather (invariant over ``axis``, like ``psum``'s)."""
    check_ring_blocks("1d", "hidden size", width, jax.lax.axis_size(axis))
    reduced = ring_reduce_scatter(partial, axis)
    return jax.lax.all_gather(reduced, axis, axis=reduced.ndim - 1, tiled=True, to="invarying")


def _row_product(x, w, axis, n):
    k = w.shape[1] // n
    return _all_reduce_by_ring(lambda m: x @ block(w, m, k, 1), axis, w.shape[1])


def _column_input_grad(dys, ws, axis, n):
    k = ws[0].shape[0] // n
    return _all_reduce_by_ring(
        lambda m: sum(dy @ block(w, m, k, 0).T for dy, w in zip(dys, ws, strict=True)),
        axis,
        ws[0].shape[0],
    )


def _align(arrays: Sequence[jax.Array], axis: AxisNames) -> list[jax.Array]:
    """Cast every array to vary over the axes (other than ``axis``) any of them varies over, so
    the custom backward rules return cotangents of their primals' types; the transposes of these
    casts (outside the rule) are the reductions autodiff would have made."""
    union = frozenset().union(*(varying_axes_of(a) for a in arrays)) - set(axis)
    return [varying(a, tuple(sorted(union))) for a in arrays]


def _branches(inside: bool):
    """Trace as inside per-stage branches where the forward pass was (a backward rule is traced
    later, outside the forward's context), so both passes hop the same way."""
    return per_stage_branches() if inside else contextlib.nullcontext()


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul_all_reduce(x, w, axis, branches):
    return _row_product(x, w, axis, jax.lax.axis_size(axis))


def _matmul_all_reduce_fwd(x, w, axis, branches):
    return _matmul_all_reduce(x, w, axis, branches), (x, w)


def _matmul_all_reduce_bwd(axis, branches, res, dy):
    x, w = res
    return (dy @ w.T).astype(x.dtype), jnp.einsum("...k,...n->kn", x, dy).astype(w.dtype)


_matmul_all_reduce.defvjp(_matmul_all_reduce_fwd, _matmul_all_reduce_bwd)


def matmul_all_reduce(x: jax.Array, w: jax.Array, axis: AxisNames) -> jax.Array:
    """Megatron's row-parallel linear ``psum(x @ w, axis)`` (``x: [..., K/n]``, ``w: [K/n, N]``)
    with the all-reduce decomposed: the reduce-scatter ring over ``N/n`` column blocks of ``w``
    (each step one partial matmul ``x @ w[:, block]``), then an all-gather of the reduced
    ``[..., N/n]`` block. Communication ``2·M·N·(n−1)/n``, as the all-reduce's; the backward
    pass moves nothing (the output cotangent is replicated over ``axis``). Memory: the ``M·N/n``
    accumulator and partial block instead of the ``M·N`` partial product."""
    x, w = _align([x, w], axis)
    return _matmul_all_reduce(x, w, axis, in_per_stage_branches())


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _column_matmuls(x, ws, axis, branches):
    return [x @ w for w in ws]


def _column_matmuls_fwd(x, ws, axis, branches):
    return _column_matmuls(x, ws, axis, branches), (x, ws)


def _column_matmuls_bwd(axis, branches, res, dys):
    x, ws = res
    with _branches(branches):
        dx = _column_input_grad(dys, ws, axis, jax.lax.axis_size(axis))
    dws = [
        jnp.einsum("...n,...k->nk", x, dy).astype(w.dtype) for w, dy in zip(ws, dys, strict=True)
    ]
    return dx.astype(x.dtype), dws


_column_matmuls.defvjp(_column_matmuls_fwd, _column_matmuls_bwd)


def column_matmuls(x: jax.Array, ws: list[jax.Array], axis: AxisNames) -> list[jax.Array]:
    """Megatron's column-parallel linears ``[x @ w for w in ws]`` sharing one input replicated
    over ``axis`` (``x: [..., N]``, ``w: [N, K/n]``; fused Q/K/V). The forward pass is local; the
    backward pass all-reduces the summed input gradient ``Σ dy @ wᵀ`` as the reduce-scatter ring
    over ``N/n`` row blocks of the weights (each step ``Σ dy @ w[block]ᵀ``) and an all-gather:
    ``2·M·N·(n−1)/n``, as the plain kernel's one all-reduce."""
    aligned = _align([x, *ws], axis)
    return _column_matmuls(aligned[0], aligned[1:], axis, in_per_stage_branches())
