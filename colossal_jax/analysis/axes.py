"""Bytes moved per device per mesh axis: each collective of a compiled program attributed to
the mesh axes its device groups run along.

A mesh of shape ``(s_0, …, s_k)`` numbers its devices (the program's partitions) ``0 … N−1``
in row-major order of their mesh coordinates (``jax.jit`` assigns partition ``i`` to
``mesh.devices.flat[i]``). For a set ``A`` of mesh axes, the devices that differ only in their
coordinates along ``A`` form the groups of a partition of ``0 … N−1``; a ``psum`` over ``A``
runs over exactly those groups. A collective is attributed to the smallest set of axes whose
partition holds each of its groups inside one group: the axes along which members of some
group differ. When its groups are that partition exactly, the attribution is *exact*
(:func:`attribute`); a permute that joins only some devices (a pipeline's stage hop) is
contained but not exact.

Axes of size 1 never appear. A collective over several axes is keyed by their names joined
with ``+`` in mesh order (``data+seq``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from colossal_jax.analysis.hlo import collective_lines, device_groups


@dataclass(frozen=True)
class Attributed:
    """One collective: ``axes`` it runs along, the bytes each device receives per program run
    (ring model, loop trip counts included) and whether its groups are exactly the partition
    of ``axes``."""

    op: str
    axes: tuple[str, ...]
    bytes: float
    exact: bool


def partition(shape: tuple[int, ...], axes: tuple[int, ...]) -> frozenset[frozenset[int]]:
    """The groups of device ids of a mesh of ``shape`` that differ only along mesh dimensions
    ``axes`` (indices)."""
    ids = np.arange(int(np.prod(shape))).reshape(shape)
    rest = [d for d in range(len(shape)) if d not in axes]
    moved = np.transpose(ids, rest + list(axes)).reshape(-1, int(np.prod([shape[a] for a in axes])))
    return frozenset(frozenset(int(i) for i in row) for row in moved)


def group_axes(
    groups: list[list[int]], shape: tuple[int, ...], names: tuple[str, ...]
) -> tuple[tuple[str, ...], bool]:
    """``(axes, exact)``: the mesh axes (names, in mesh order) the device ``groups`` of one
    collective run along, and whether the groups are exactly that axes' partition."""
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape), axis=1)
    varying: set[int] = set()
    for group in groups:
        if len(group) > 1:
            c = coords[group]
            varying |= {d for d in range(len(shape)) if len(set(c[:, d])) > 1}
    dims = tuple(sorted(varying))
    if not dims:
        return (), True
    exact = frozenset(frozenset(g) for g in groups) == partition(shape, dims)
    return tuple(names[d] for d in dims), exact


def attribute(
    hlo_text: str,
    shape: tuple[int, ...],
    names: tuple[str, ...],
    branch_counts: dict[int, list[int]] | None = None,
) -> list[Attributed]:
    """Every collective of a compiled program over a mesh of ``shape`` (axis ``names``) with
    the axes it runs along (``branch_counts``: :func:`colossal_jax.analysis.hlo.analyze`'s)."""
    n = int(np.prod(shape))
    out = []
    for collective, line in collective_lines(hlo_text, branch_counts):
        axes, exact = group_axes(device_groups(line, n), shape, names)
        out.append(Attributed(collective.op, axes, collective.total_bytes, exact))
    return out


def axis_bytes(
    hlo_text: str,
    shape: tuple[int, ...],
    names: tuple[str, ...],
    branch_counts: dict[int, list[int]] | None = None,
) -> dict[str, float]:
    """Bytes each device receives per program run, by mesh axis (``+``-joined for a collective
    over several axes); collectives that move nothing (groups of one device) are left out."""
    out: dict[str, float] = defaultdict(float)
    for a in attribute(hlo_text, shape, names, branch_counts):
        if a.axes and a.bytes > 0:
            out["+".join(a.axes)] += a.bytes
    return dict(out)
