"""The active parallelism: which layout and which attention kernel the layers route to.

A model never names a parallel mode. While a step is traced, :func:`use_parallelism` makes one
layout (and the per-device attention kernel of the sequence mode) active; every library layer
asks :func:`active` which kernels to call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import jax
from jax.sharding import AxisType

from colossal_jax.config import MESH_ORDER
from colossal_jax.sequence.local import dot_product_attention
from colossal_jax.tensor.layout import ActivationAxes, LocalAttention, TensorLayout
from colossal_jax.tensor.replicated import ReplicatedLayout


@dataclass(frozen=True)
class Parallelism:
    layout: TensorLayout
    local_attention: LocalAttention


_ACTIVE: contextvars.ContextVar[Parallelism | None] = contextvars.ContextVar(
    "colossal_jax_parallelism", default=None
)


@functools.cache
def single_device(platform: str | None = None) -> Parallelism:
    """No parallelism, on the first device of ``platform`` (``"cpu"``, ``"gpu"``; the default
    backend's when None): what :func:`active` returns when nothing was set."""
    mesh = jax.make_mesh(
        (1,) * len(MESH_ORDER),
        MESH_ORDER,
        axis_types=(AxisType.Auto,) * len(MESH_ORDER),
        devices=jax.devices(platform)[:1],
    )
    layout = ReplicatedLayout(mesh, ActivationAxes(batch=("data",), seq="seq"))
    return Parallelism(layout, dot_product_attention)


def active() -> Parallelism:
    """The parallelism in force (one device, no parallelism, if none was set)."""
    current = _ACTIVE.get()
    return current if current is not None else single_device()


@contextlib.contextmanager
def use_parallelism(
    layout: TensorLayout, local_attention: LocalAttention | None = None
) -> Iterator[Parallelism]:
    """Route the library's layers to ``layout`` (and ``local_attention``) inside the block."""
    if local_attention is None:
        local_attention = dot_product_attention
    token = _ACTIVE.set(Parallelism(layout, local_attention))
    try:
        yield _ACTIVE.get()  # type: ignore[misc]
    finally:
        _ACTIVE.reset(token)
