"""Build the one 6-axis device mesh, from a resolved :class:`Plan` or a :class:`ParallelConfig`.

Axis order of the physical mesh is :data:`colossal_jax.config.MESH_ORDER`: ``data`` outermost (it
crosses hosts and carries only the gradient all-reduce), tensor axes innermost (they carry the
most traffic and belong on the fastest links). ``jax.make_mesh`` lays devices out in that order,
respecting the hardware topology and process boundaries on multi-host systems.
"""

from __future__ import annotations

import jax
from jax.sharding import AxisType, Mesh

from colossal_jax.config import MESH_ORDER, ParallelConfig
from colossal_jax.config.plan import Plan


def mesh_of(plan: Plan, devices: list | None = None) -> Mesh:
    """The mesh of ``plan`` over the first ``plan.n_devices`` of ``devices`` (default: all
    devices of all processes). Not validated again: resolving the plan checked its shape."""
    devices = list(jax.devices()) if devices is None else list(devices)
    return _make(plan.mesh_shape, devices[: plan.n_devices])


def build_mesh(cfg: ParallelConfig, devices: list | None = None) -> Mesh:
    """The mesh for ``cfg`` over ``devices`` (default: all devices of all processes), after
    :meth:`ParallelConfig.validate` against their count (for callers without a plan)."""
    devices = list(jax.devices()) if devices is None else list(devices)
    cfg.validate(len(devices))
    return _make(tuple(getattr(cfg, a) for a in MESH_ORDER), devices)


def _make(shape: tuple[int, ...], devices: list) -> Mesh:
    return jax.make_mesh(
        shape, MESH_ORDER, axis_types=(AxisType.Auto,) * len(MESH_ORDER), devices=devices
    )
