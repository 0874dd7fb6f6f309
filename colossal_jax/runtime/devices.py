"""The devices of this run: simulated CPU devices set up before JAX starts its backends
(:func:`simulate_cpu_devices`), and the devices JAX reports once it has, as the plain numbers a
plan is resolved for (:func:`current_devices`).

Nothing here imports JAX at module level: ``simulate_cpu_devices`` must run before anything asks
JAX for its devices (``jax.devices()``, creating an array, building a mesh), because XLA reads
``--xla_force_host_platform_device_count`` once, when the CPU backend is created.
"""

from __future__ import annotations

import os
import re
import sys

from colossal_jax.config import ConfigError
from colossal_jax.config.plan import DEVICE_COUNT_FLAG as _FLAG
from colossal_jax.config.plan import Devices
from colossal_jax.config.plan import devices_hint as devices_hint


def current_devices() -> Devices:
    """The devices JAX has started with, as a :class:`Devices`: every process's count, the
    backend, and the memory of the first local device (its ``bytes_limit``, or on a CPU the
    host's memory shared by the simulated local devices; unknown otherwise)."""
    import jax

    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    memory, shared_by = None, 1
    if "bytes_limit" in stats:
        memory = int(stats["bytes_limit"])
    elif device.platform == "cpu" and hasattr(os, "sysconf"):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        shared_by = jax.local_device_count()
    return Devices(
        count=jax.device_count(),
        platform=jax.default_backend(),
        memory_bytes=memory,
        memory_shared_by=shared_by,
        process_count=jax.process_count(),
        process_index=jax.process_index(),
    )


def backends_initialized() -> bool:
    """Whether JAX has already created its backends (after which the device count is fixed)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX without this private module
        return False
    return bool(getattr(xla_bridge, "_backends", {}))


def simulate_cpu_devices(n: int, *, force_cpu: bool = False, at_least: bool = False) -> None:
    """Make the CPU backend expose ``n`` devices, so meshes of ``n`` devices run on one host.

    Call it at the top of a script, before anything touches JAX's devices (importing
    ``colossal_jax`` or ``jax`` is fine; ``jax.devices()`` or creating an array is not). It sets
    ``XLA_FLAGS=--xla_force_host_platform_device_count=n`` (replacing an earlier count) and, with
    ``force_cpu=True``, ``JAX_PLATFORMS=cpu`` so that a GPU or TPU present is not used.

    Raises ``ConfigError`` naming the fix if JAX's backends already started with fewer than ``n``
    devices (then the flag can no longer take effect). If they started with ``n`` or more, nothing
    changes and no error is raised. With ``at_least=True`` an earlier count of ``n`` or more in
    ``XLA_FLAGS`` is kept too (a caller that needs ``n`` devices, not exactly ``n``).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"simulate_cpu_devices({n!r}): n must be a positive integer, e.g. 8")
    if backends_initialized():
        import jax

        have = jax.device_count()
        if have >= n:
            return
        raise ConfigError(
            f"simulate_cpu_devices({n}) came too late: JAX has already started with {have} "
            f"device(s) ({jax.default_backend()}). Call colossal_jax.simulate_cpu_devices({n}) "
            "at the top of the script, before anything touches JAX (jax.devices(), creating an "
            f"array), or set XLA_FLAGS={_FLAG}={n} in the environment before Python starts"
        )
    flags = os.environ.get("XLA_FLAGS", "")
    earlier = re.search(rf"{_FLAG}=(\d+)", flags)
    if at_least and earlier is not None and int(earlier.group(1)) >= n:
        return
    flags = re.sub(rf"{_FLAG}=\S*", "", flags).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={n}".strip()
    if force_cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            import jax

            jax.config.update("jax_platforms", "cpu")
