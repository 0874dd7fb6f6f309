"""The pipeline executor's slot buffers: per stage, ``[slots, ...]`` arrays that a tick reads
one slot of and writes one slot of in place (the tick table names the slots,
:mod:`colossal_jax.pipeline.schedule`), and the packed **records** of a split backward.

Memory: a buffer holds its slot count times one entry; a read or write moves one entry.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from colossal_jax.tensor.kernels import varying, varying_axes_of


def zeros(shape: tuple[int, ...], like) -> jax.Array:
    """Zeros of ``shape`` with the dtype of ``like``, varying over the same mesh axes."""
    return varying(jnp.zeros(shape, like.dtype), tuple(sorted(varying_axes_of(like))))


def read(buf: jax.Array, slot: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(buf, jnp.maximum(slot, 0), 0, keepdims=False)


def write(buf: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_index_in_dim(buf, value, jnp.maximum(slot, 0), 0)


def write_if(buf: jax.Array, slot: jax.Array, value: jax.Array) -> jax.Array:
    """Store ``value`` at ``slot`` unless ``slot < 0`` (then the buffer is unchanged)."""
    keep = read(buf, slot)
    return write(buf, slot, jnp.where(slot >= 0, value, keep))


class Records:
    """A split backward's per-microbatch-chunk state in one **record** slot from its F to its
    W (:func:`colossal_jax.pipeline.schedule.build`'s ``saved`` records): from the F the
    chunk's residuals, from the B in their place the linears' inputs and output gradients
    (:mod:`colossal_jax.layers.linear_tape`), read by the W. The leaves are packed flat into one
    buffer per (dtype, varying axes) group, ``[records, max(residuals, inputs + output
    gradients)]``, so a record costs the larger of what it holds before and after its B, not
    the sum."""

    KINDS = ("res", "saved", "wgrad")

    def __init__(self, res: list, saved: list, wgrad: list):
        self.groups: dict[tuple, dict[str, list]] = {}
        for kind, leaves in zip(self.KINDS, (res, saved, wgrad), strict=True):
            for i, a in enumerate(leaves):
                key = (jnp.dtype(a.dtype), tuple(sorted(varying_axes_of(a))))
                group = self.groups.setdefault(key, {k: [] for k in self.KINDS})
                group[kind].append((i, tuple(a.shape), a))
        self.width, self.offset = {}, {}
        for key, group in self.groups.items():
            size = {k: sum(math.prod(shape) for _, shape, _ in group[k]) for k in self.KINDS}
            self.offset[key] = {"res": 0, "saved": 0, "wgrad": size["saved"]}
            self.width[key] = max(size["res"], size["saved"] + size["wgrad"])
        self.counts = {k: len(v) for k, v in zip(self.KINDS, (res, saved, wgrad), strict=True)}

    def empty(self, n: int) -> list[jax.Array]:
        return [zeros((n, self.width[key]), self._like(key)) for key in self.groups]

    def _like(self, key):
        group = self.groups[key]
        return next(a for k in self.KINDS for _, _, a in group[k])

    def unpack(self, bufs: list[jax.Array], slot: jax.Array, kind: str) -> list[jax.Array]:
        """The leaves of ``kind`` (in their original order) from record ``slot``."""
        out: list[Any] = [None] * self.counts[kind]
        row = jnp.maximum(slot, 0)
        for key, buf in zip(self.groups, bufs, strict=True):
            at = self.offset[key][kind]
            for i, shape, _ in self.groups[key][kind]:
                n = math.prod(shape)  # each leaf sliced from the buffer: no row-sized copy
                out[i] = jax.lax.dynamic_slice(buf, (row, at), (1, n)).reshape(shape)
                at += n
        return out

    def store(
        self, bufs: list[jax.Array], at: jax.Array, leaves: dict[str, list]
    ) -> list[jax.Array]:
        """``bufs`` with the leaves of each kind in ``leaves`` written in place at their offsets
        in record ``at`` (``-1``: none). Leaf by leaf: a packed row would be a row-sized
        temporary, and a read of the whole row for the ``where`` another."""
        row = jnp.maximum(at, 0)
        out = []
        for key, buf in zip(self.groups, bufs, strict=True):
            for kind, kind_leaves in leaves.items():
                off = self.offset[key][kind]
                for i, shape, _ in self.groups[key][kind]:
                    n = math.prod(shape)
                    old = jax.lax.dynamic_slice(buf, (row, off), (1, n))
                    new = jnp.where(at >= 0, kind_leaves[i].reshape(1, n), old)
                    buf = jax.lax.dynamic_update_slice(buf, new, (row, off))
                    off += n
            out.append(buf)
        return out
