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
    W (:func:`colossal_jax.pipeline.schedule.build`'s ``saved`` records): the linears' saved
    inputs, the chunk's residuals until its B, and from the B, in the residuals' place, the
    linears' output gradients until the W. The leaves are packed flat into one buffer per
    (dtype, varying axes) group, ``[records, saved + max(residuals, output gradients)]``, so a
    record costs the larger of what it holds before and after its B — the 1F1B residual set
    whenever the output gradients are no larger than the residuals — not the sum."""

    KINDS = ("saved", "res", "wgrad")

    def __init__(self, saved: list, res: list, wgrad: list):
        self.groups: dict[tuple, dict[str, list]] = {}
        for kind, leaves in zip(self.KINDS, (saved, res, wgrad), strict=True):
            for i, a in enumerate(leaves):
                key = (jnp.dtype(a.dtype), tuple(sorted(varying_axes_of(a))))
                group = self.groups.setdefault(key, {k: [] for k in self.KINDS})
                group[kind].append((i, tuple(a.shape), a))
        self.width, self.offset = {}, {}
        for key, group in self.groups.items():
            size = {k: sum(math.prod(shape) for _, shape, _ in group[k]) for k in self.KINDS}
            self.offset[key] = size["saved"]
            self.width[key] = size["saved"] + max(size["res"], size["wgrad"])
        self.counts = {k: len(v) for k, v in zip(self.KINDS, (saved, res, wgrad), strict=True)}

    def empty(self, n: int) -> list[jax.Array]:
        return [zeros((n, self.width[key]), self._like(key)) for key in self.groups]

    def _like(self, key):
        group = self.groups[key]
        return next(a for k in self.KINDS for _, _, a in group[k])

    def _flat(self, key, kind: str, leaves: list) -> list[jax.Array]:
        return [leaves[i].reshape(-1) for i, _, _ in self.groups[key][kind]]

    def pack_forward(self, saved: list, res: list) -> list[jax.Array]:
        """Each group's row after an F: saved inputs, then residuals (then padding)."""
        rows = []
        for key in self.groups:
            parts = self._flat(key, "saved", saved) + self._flat(key, "res", res)
            pad = self.width[key] - sum(p.shape[0] for p in parts)
            rows.append(jnp.concatenate(parts + [zeros((pad,), self._like(key))]))
        return rows

    def pack_backward(self, wgrad: list) -> list[jax.Array]:
        """Each group's tail after a B: the output gradients (then padding), written from the
        group's offset over the residuals."""
        rows = []
        for key in self.groups:
            parts = self._flat(key, "wgrad", wgrad)
            pad = self.width[key] - self.offset[key] - sum(p.shape[0] for p in parts)
            rows.append(jnp.concatenate(parts + [zeros((pad,), self._like(key))]))
        return rows

    def unpack(self, bufs: list[jax.Array], slot: jax.Array, kind: str) -> list[jax.Array]:
        """The leaves of ``kind`` (in their original order) from record ``slot``."""
        out: list[Any] = [None] * self.counts[kind]
        for key, buf in zip(self.groups, bufs, strict=True):
            group = self.groups[key][kind]
            if not group:
                continue
            row = read(buf, slot)
            at = 0 if kind == "saved" else self.offset[key]
            for i, shape, _ in group:
                n = math.prod(shape)
                out[i] = row[at : at + n].reshape(shape)
                at += n
        return out

    def store(self, bufs, forward_at, backward_at, out) -> list[jax.Array]:
        """``bufs`` after a tick: an F's row written whole at ``forward_at``, a B's tail at
        ``backward_at`` (``-1``: not this tick)."""
        fwd = self.pack_forward(out["saved"], out["res"])
        bwd = self.pack_backward(out["wgrad"])
        new = []
        for key, buf, f, b in zip(self.groups, bufs, fwd, bwd, strict=True):
            buf = write_if(buf, forward_at, f)
            at = jnp.maximum(backward_at, 0)
            old = jax.lax.dynamic_slice(buf, (at, self.offset[key]), (1, b.shape[0]))[0]
            b = jnp.where(backward_at >= 0, b, old)
            new.append(jax.lax.dynamic_update_slice(buf, b[None], (at, self.offset[key])))
        return new
