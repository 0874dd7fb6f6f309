"""Batches as global arrays: each process builds only its addressable shards, and every
training batch carries this process's stop flag (the signal it received, if any), so the
processes of a multi-process run learn of a signal at the same step."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.runtime import signals
from colossal_jax.training.run import Run


def global_batch(run: Run, step: int) -> dict[str, jax.Array]:
    """The batch of ``step`` as global arrays (each process builds only its addressable shards)
    with this process's :func:`stop_flags` under ``"stop"``."""
    batch = place_batch(run, run.batches.batch(step))
    batch["stop"] = stop_flags(run.mesh)
    return batch


def place_batch(run: Run, host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """A batch of host arrays (the same on every process) as global arrays in the run's batch
    sharding."""
    return {
        k: jax.make_array_from_callback(v.shape, run.batch_sharding, lambda idx, v=v: v[idx])
        for k, v in host.items()
    }


def stop_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """One element per device: ``[mesh.size]`` split over every mesh axis."""
    return NamedSharding(mesh, P(tuple(mesh.axis_names)))


def stop_flags(mesh: jax.sharding.Mesh) -> jax.Array:
    """This process's stop request on each of its devices: the number of the SIGINT/SIGTERM it
    received (:mod:`colossal_jax.runtime.signals`), 0 if none. The step returns the largest flag
    of any device as its ``stop`` metric, so the processes of a multi-process run learn of a
    signal that any one of them received at the same step, and stop and save together."""
    flag = signals.received() or 0
    host = np.full((mesh.size,), int(flag), np.int32)
    return jax.make_array_from_callback(host.shape, stop_sharding(mesh), lambda idx: host[idx])
