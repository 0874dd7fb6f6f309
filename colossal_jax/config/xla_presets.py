"""Named sets of XLA flags (``--xla-preset NAME``), applied only when asked and always printed.

XLA reads ``XLA_FLAGS`` once, when the backend starts, so a preset must be applied before JAX
starts: ``cli.main`` (and ``scripts/bench_throughput.py``) call :func:`apply` right after
parsing the flags; from Python, call it before the first JAX computation. A flag the user
already set in ``XLA_FLAGS`` keeps the user's value (the line printed says which were kept).
``train()`` refuses a configuration naming a preset whose flags are not in ``XLA_FLAGS``
(:func:`check_applied`), so a preset is never silently absent.

``gpu-perf``, for NVIDIA GPUs, after the JAX GPU performance tips
(https://docs.jax.dev/en/latest/gpu_performance_tips.html) and NVIDIA's JAX-Toolbox
"Tips for High-Performance LLMs with JAX and XLA" (rosetta/docs/GPU_performance.md):

- ``--xla_gpu_enable_latency_hiding_scheduler=true``: schedule collectives asynchronously so
  they overlap with compute (data-parallel gradient all-reduce, ZeRO gathers, tensor-parallel
  collectives);
- ``--xla_gpu_enable_highest_priority_async_stream=true``: collectives on a high-priority
  stream, so compute kernels do not delay them;
- ``--xla_gpu_all_reduce_combine_threshold_bytes``, ``..._all_gather_...``,
  ``..._reduce_scatter_...``: combine small collectives up to 128/128/64 MiB, fewer launches;
- ``--xla_gpu_enable_pipelined_all_gather/reduce_scatter/all_reduce=true``: pipeline the
  collectives of one scanned layer with the compute of the next (ZeRO-3's per-layer gathers and
  reduce-scatters, the layer stack's scan);
- ``--xla_gpu_enable_while_loop_double_buffering=true``: double-buffer the scan's loop
  carries so the pipelined collectives have a buffer to land in.

Every flag exists in jaxlib 0.10.2 (an unknown flag aborts XLA at start-up; the flags were
checked by starting JAX with them). On a CPU the GPU flags are parsed and have no effect.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from colossal_jax.config.errors import ConfigError

MIB = 1 << 20

PRESETS: dict[str, tuple[str, ...]] = {
    "gpu-perf": (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        "--xla_gpu_enable_highest_priority_async_stream=true",
        f"--xla_gpu_all_reduce_combine_threshold_bytes={128 * MIB}",
        f"--xla_gpu_all_gather_combine_threshold_bytes={128 * MIB}",
        f"--xla_gpu_reduce_scatter_combine_threshold_bytes={64 * MIB}",
        "--xla_gpu_enable_pipelined_all_gather=true",
        "--xla_gpu_enable_pipelined_reduce_scatter=true",
        "--xla_gpu_enable_pipelined_all_reduce=true",
        "--xla_gpu_enable_while_loop_double_buffering=true",
    ),
}
"""Preset name -> XLA flags (``--name=value``)."""


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


def _present(flags: str) -> dict[str, str]:
    """``--name -> --name=value`` of every flag in an ``XLA_FLAGS`` string."""
    return {_name(f): f for f in flags.split() if f.startswith("--")}


def apply(name: str, environ: MutableMapping[str, str] | None = None) -> str:
    """Add preset ``name``'s flags to ``XLA_FLAGS`` in ``environ`` (default ``os.environ``)
    unless set already; returns the line to print (what was added, what was kept)."""
    env = os.environ if environ is None else environ
    flags = PRESETS[name]
    current = env.get("XLA_FLAGS", "")
    have = _present(current)
    added = [f for f in flags if _name(f) not in have]
    kept = [have[_name(f)] for f in flags if _name(f) in have and have[_name(f)] != f]
    if added:
        env["XLA_FLAGS"] = " ".join([current, *added]).strip()
    line = f"xla preset {name}: XLA_FLAGS += {' '.join(added) if added else '(nothing new)'}"
    if kept:
        line += f"; kept the XLA_FLAGS values {' '.join(kept)}"
    return line


def check_applied(name: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Raise ``ConfigError`` unless every flag of preset ``name`` is set in ``XLA_FLAGS``."""
    env = os.environ if environ is None else environ
    have = _present(env.get("XLA_FLAGS", ""))
    missing = [f for f in PRESETS[name] if _name(f) not in have]
    if missing:
        raise ConfigError(
            f"--xla-preset {name} is not in effect: XLA_FLAGS lacks {missing[0]} (and "
            f"{len(missing) - 1} more); XLA reads its flags when JAX starts, so call "
            f"colossal_jax.config.xla_presets.apply({name!r}) before the first JAX computation, or "
            "pass --xla-preset on the command line"
        )
