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

    def _row(self, key, parts: list[jax.Array]) -> jax.Array:
        pad = self.width[key] - sum(p.shape[0] for p in parts)
        return jnp.concatenate(parts + [zeros((pad,), self._like(key))])

    def _flat(self, key, kind: str, leaves: list) -> list[jax.Array]:
        return [leaves[i].reshape(-1) for i, _, _ in self.groups[key][kind]]

    def pack_forward(self, res: list) -> list[jax.Array]:
        """Each group's row after an F: the residuals (then padding)."""
        return [self._row(key, self._flat(key, "res", res)) for key in self.groups]

    def pack_backward(self, saved: list, wgrad: list) -> list[jax.Array]:
        """Each group's row after a B: the linears' inputs, then their output gradients."""
        return [
            self._row(key, self._flat(key, "saved", saved) + self._flat(key, "wgrad", wgrad))
            for key in self.groups
        ]

    def unpack(self, bufs: list[jax.Array], slot: jax.Array, kind: str) -> list[jax.Array]:
        """The leaves of ``kind`` (in their original order) from record ``slot``."""
        out: list[Any] = [None] * self.counts[kind]
        for key, buf in zip(self.groups, bufs, strict=True):
            group = self.groups[key][kind]
            if not group:
                continue
            row = read(buf, slot)
            at = self.offset[key][kind]
            for i, shape, _ in group:
                n = math.prod(shape)
                out[i] = row[at : at + n].reshape(shape)
                at += n
        return out

    def blank(self) -> list[jax.Array]:
        """Each group's row of a tick that writes no record."""
        return [zeros((self.width[key],), self._like(key)) for key in self.groups]

    def store(self, bufs: list[jax.Array], at: jax.Array, rows: list[jax.Array]) -> list[jax.Array]:
        """``bufs`` with ``rows`` (an F's or a B's) written at record ``at`` (``-1``: none):
        one in-place write per tick (two writes into a loop-carried buffer made XLA copy it
        whole at every tick)."""
        return [write_if(buf, at, row) for buf, row in zip(bufs, rows, strict=True)]
