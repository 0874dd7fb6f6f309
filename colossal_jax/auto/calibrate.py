"""One-off calibration of this machine's CPU for the planner's hardware model
(:func:`colossal_jax.auto.hardware.load_cpu` reads what :func:`calibrate` returns).

Measured on the simulated devices of this process (``N`` of them sharing the host's cores),
every figure the median of ``repeats`` timed runs after a warm-up, each blocked on:

- **matmul FLOP/s of the host**: every device multiplies its own ``[m, k] × [k, n]`` blocks at
  once (one ``shard_map`` over all ``N`` devices); ``flops_per_s`` is ``N · 2mkn / t`` for the
  largest shape measured (the step's matmuls are of that size), the others are kept as points.
- **α-β of collectives**: on a mesh ``(N/s, s)``, a ``psum`` (all-reduce), an ``all_gather``
  and a ring ``ppermute`` over the inner axis of ``s`` devices, for every ``s`` dividing ``N``
  and payloads from 4 KiB to 4 MiB per device; ``t = α + B/β`` fitted by least squares with
  ``B`` the bytes each device receives (the ring model of :mod:`colossal_jax.analysis.hlo`).
  Simulated devices are one host's memory, so every mesh axis is the same link: each axis of
  the document gets the fit over every op and group size (``collectives`` keeps each op's and
  size's own fit).

The figures are of a shared, possibly loaded machine; the document records ``uptime``'s load
average beside them.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.config.choices import MESH_ORDER

MATMUL_SHAPES = ((128, 256, 256), (256, 256, 1024), (512, 256, 1024))
"""``(m, k, n)`` per device: the shapes of a 256-wide model's projections at 128–512 tokens."""
PAYLOADS = (4 << 10, 64 << 10, 512 << 10, 4 << 20)
"""Bytes per device of each collective's operand."""
OPS = ("all-reduce", "all-gather", "collective-permute")


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_points(repeats: int, shapes=MATMUL_SHAPES) -> list[dict[str, float]]:
    """``{m, k, n, seconds, host_flops_per_s}`` of every device's block matmul at once."""
    n_dev = jax.device_count()
    mesh = jax.make_mesh((n_dev,), ("d",))
    out = []
    for m, k, n in shapes:
        a = jax.device_put(jnp.ones((n_dev * m, k)), NamedSharding(mesh, P("d")))
        b = jax.device_put(jnp.ones((n_dev * k, n)), NamedSharding(mesh, P("d")))
        f = jax.jit(
            jax.shard_map(jnp.matmul, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))
        )
        t = timed(lambda f=f, a=a, b=b: f(a, b), repeats)
        out.append(
            {"m": m, "k": k, "n": n, "seconds": t, "host_flops_per_s": n_dev * 2 * m * k * n / t}
        )
    return out


def received_bytes(op: str, payload: int, size: int) -> float:
    """Bytes each device receives: an all-reduce of ``payload`` ``2·P·(s−1)/s``, an all-gather
    of ``payload`` per device ``P·(s−1)``, a permute ``P``."""
    if op == "all-reduce":
        return 2 * payload * (size - 1) / size
    if op == "all-gather":
        return payload * (size - 1)
    return float(payload)


def _collective(op: str, size: int) -> Callable[[jax.Array], jax.Array]:
    if op == "all-reduce":
        return lambda x: jax.lax.psum(x, "s")
    if op == "all-gather":
        return lambda x: jax.lax.all_gather(x, "s", tiled=True)
    ring = [(i, (i + 1) % size) for i in range(size)]
    return lambda x: jax.lax.ppermute(x, "s", ring)


def collective_points(repeats: int, payloads=PAYLOADS) -> list[dict[str, Any]]:
    """``{op, size, payload, bytes, seconds}`` for every op, group size ``s > 1`` dividing the
    device count and payload."""
    n_dev = jax.device_count()
    out = []
    for size in [s for s in range(2, n_dev + 1) if n_dev % s == 0]:
        mesh = jax.make_mesh((n_dev // size, size), ("o", "s"))
        spec = P(("o", "s"))
        for op in OPS:
            body = _collective(op, size)
            f = jax.jit(
                jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
            )
            for payload in payloads:
                x = jax.device_put(jnp.ones((n_dev * payload // 4,)), NamedSharding(mesh, spec))
                t = timed(lambda f=f, x=x: f(x), repeats)
                out.append(
                    {
                        "op": op,
                        "size": size,
                        "payload": payload,
                        "bytes": received_bytes(op, payload, size),
                        "seconds": t,
                    }
                )
    return out


def fit_alpha_beta(points: list[dict[str, Any]]) -> dict[str, float]:
    """``{alpha_s, beta_bytes_per_s}`` of ``t = α + B/β`` by least squares over ``points``
    (``bytes``, ``seconds``); α is floored at 0 and β at 1 byte/s."""
    x = np.array([p["bytes"] for p in points], dtype=float)
    y = np.array([p["seconds"] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1) if len(set(x)) > 1 else (y.mean() / x.mean(), 0.0)
    if intercept < 0:  # a line through the origin
        slope, intercept = float((x @ y) / (x @ x)), 0.0
    return {"alpha_s": float(intercept), "beta_bytes_per_s": float(1 / max(slope, 1e-30))}


def calibrate(repeats: int = 5, payloads=PAYLOADS, shapes=MATMUL_SHAPES) -> dict[str, Any]:
    """The calibration document of this process's devices (see the module docstring)."""
    t0 = time.perf_counter()
    n_dev = jax.device_count()
    matmuls = matmul_points(repeats, shapes)
    points = collective_points(repeats, payloads)
    overall = fit_alpha_beta(points)
    per = {
        f"{op}/{size}": fit_alpha_beta([p for p in points if p["op"] == op and p["size"] == size])
        for op in OPS
        for size in sorted({p["size"] for p in points})
    }
    load = os.getloadavg()
    return {
        "device": "cpu",
        "flops_per_s": matmuls[-1]["host_flops_per_s"],
        "devices": n_dev,
        "axes": {axis: dict(overall) for axis in MESH_ORDER},
        **overall,
        "memory_bytes": _host_memory(),
        "matmul": matmuls,
        "collectives": {"fits": per, "points": points},
        "note": (
            f"scripts/calibrate_cpu.py on {n_dev} simulated CPU devices, jax {jax.__version__}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
            f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} (1/5/15 min), "
            f"{time.perf_counter() - t0:.0f} s"
        ),
    }


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
