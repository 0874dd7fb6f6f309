"""JAX's persistent compilation cache, turned off for the one kind of run it is known to break.

On the CPU backend (jax 0.10.2), a train step with ring attention (``seq_mode="ring"``) that is
loaded back from the persistent cache (``JAX_COMPILATION_CACHE_DIR`` or
``jax_compilation_cache_dir``) deadlocks: its simulated devices wait at one collective id for
different collectives (a collective permute on some, an all-reduce on others) and XLA aborts the
process after 40 seconds. The same step compiled afresh runs. Loading from the cache was checked
and works for Ulysses, ring self-attention, 1F1B pipelines, 2D and 3D tensor parallelism and
ZeRO-3 (``scripts/train.py --devices 8 ... --steps 3`` run twice on one cache folder).

:func:`cache_safe_for` turns the cache off for such a run and gives the note to print; every
other run keeps it. Nothing changes on a GPU (the bug was not looked for there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def _cache_on() -> bool:
    import jax

    return bool(jax.config.jax_compilation_cache_dir) and bool(
        jax.config.jax_enable_compilation_cache
    )


@contextlib.contextmanager
def cache_safe_for(seq_mode: str, platform: str) -> Iterator[str | None]:
    """Within the block, JAX's persistent compilation cache is off if it is on and the run is a
    ring-attention run on the CPU backend (``seq_mode == "ring"`` and ``platform == "cpu"``);
    yields the one-line note saying so, or ``None`` when nothing changed. The setting and JAX's
    cache state are restored when the block ends."""
    if seq_mode != "ring" or platform != "cpu" or not _cache_on():
        yield None
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    cc.reset_cache()
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield (
            "the persistent compilation cache is off for this run: on the CPU backend a ring-"
            "attention step loaded from it deadlocks (a JAX/XLA bug); it compiles afresh"
        )
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        cc.reset_cache()
