"""The planner's search space: every way to run a :class:`TrainConfig` on ``n`` devices.

A candidate is a :class:`ParallelConfig` (the *layout*: the six axis sizes, the tensor mode and
its grid, the sequence mode, the pipeline schedule with its microbatches and virtual stages)
together with the *memory knobs* (ZeRO stage, remat policy, offload, gradient accumulation).
Validity is decided by :func:`colossal_jax.checks.resolve.resolve` alone (pure, tens of µs, no
compile): what it rejects is dropped, nothing else.

Enumeration (:func:`layouts`, :func:`knobs`):

- every ordered factorization ``n = data · pipe · tensor · seq``;
- the tensor group factored by every registered splitting mode and, for a mode that takes a
  depth (2.5D), every depth above 1 (depth 1 is the 2D grid);
- every registered sequence mode that splits the sequence when ``seq > 1``;
- every pipelined schedule when ``pipe > 1``, with microbatches ``M ∈ {p, 2p, 4p, 8p}`` and,
  for a virtual schedule, ``V ∈ {2, 4}``;
- ZeRO 0–3 (1–3 only with ``data > 1``), remat ``none | dots | selective | full | offload``,
  offload ``none | optimizer | params`` (``params`` only with ZeRO-3), gradient accumulation in
  powers of two while a microbatch keeps a sequence per batch shard.

Pruning (each rule says why it loses nothing worth having):

- the tensor group and the sequence group stay inside one node (:attr:`Hardware.node`; 8 GPUs):
  their collectives sit on every layer's critical path and InfiniBand is 9× slower than NVLink
  (the rule Megatron-LM and the Colossal-AI paper follow);
- microbatches only in the doublings above, virtual stages 2 and 4 (the bubble halves per
  doubling; finer steps change the step time by less than the model's error);
- remat ``offload`` is not searched with a pipeline: the tick's branches write the residuals
  into the record buffers in device memory and the offloaded ones are in host memory (the
  branches' types differ; JAX 0.10.2), so such a plan does not compile, and ``resolve``
  refuses it (``--remat offload`` with ``--pipe`` > 1);
- ``--collective-matmul`` stays off (same bytes; on CPU it measured no faster,
  docs/performance.md);
- with a pipeline, accumulation runs as ``M·accum`` microbatches through the schedule, the same
  schedule as ``M·accum`` pipeline microbatches: it is searched only beyond the largest ``M``;
- the memory knobs are not crossed blindly: :mod:`colossal_jax.auto.search` costs every
  combination analytically and resolves a layout's combinations fastest-first, so a layout
  stops at its first combination that resolves and fits (:func:`knobs` gives them all).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from colossal_jax.config import pipelines, seq_modes, tensor_modes
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.schema import ParallelConfig, TrainConfig

REMATS = ("none", "dots", "selective", "full", "offload")
"""The remat policies searched (every one the project has), cheapest recompute first."""
OFFLOADS = ("none", "optimizer", "params")
MICROBATCH_FACTORS = (1, 2, 4, 8)
"""Pipeline microbatches as multiples of ``pipe``."""
VIRTUAL_STAGES = (2, 4)


@dataclass(frozen=True)
class Knobs:
    """The memory knobs of a candidate: ZeRO stage, remat policy, offload, accumulation."""

    zero: int
    remat: str
    offload: str
    grad_accum: int

    def apply(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with these knobs (``device_batch`` cleared: accumulation is explicit)."""
        return dataclasses.replace(cfg, **self.changes(cfg))

    def changes(self, cfg: TrainConfig) -> dict[str, Any]:
        """The fields of ``cfg`` these knobs set, as :meth:`apply` sets them."""
        return {
            "remat": self.remat,
            "offload": self.offload,
            "grad_accum": self.grad_accum,
            "device_batch": None,
            "parallel": with_zero(cfg.parallel, self.zero),
        }

    def describe(self) -> str:
        parts = [f"zero={self.zero}", f"remat={self.remat}"]
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        if self.grad_accum > 1:
            parts.append(f"accum={self.grad_accum}")
        return " ".join(parts)


@functools.lru_cache(maxsize=1024)
def with_zero(par: ParallelConfig, zero: int) -> ParallelConfig:
    """``par`` at ZeRO stage ``zero`` (kept: a layout's knob combinations share four)."""
    return dataclasses.replace(par, zero=zero)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def factorizations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered ``parts``-tuple of positive integers whose product is ``n``."""
    if parts == 1:
        yield (n,)
        return
    for d in divisors(n):
        for rest in factorizations(n // d, parts - 1):
            yield (d, *rest)


def tensor_grids(total: int) -> list[tuple[str, dict[str, int]]]:
    """``(tensor mode, tensor axis sizes)`` for a tensor group of ``total`` devices: ``none``
    for 1, else every registered splitting mode's factorings (every depth of a mode that takes
    one)."""
    if total == 1:
        return [("none", {})]
    out: list[tuple[str, dict[str, int]]] = []
    for mode in tensor_modes.TABLE:
        if not mode.splits_tensor:
            continue
        depths: list[int | None] = list(divisors(total)) if mode.takes_depth else [None]
        seen: list[dict[str, int]] = []
        for depth in depths:
            try:
                sizes = mode.factor(total, depth)
                mode.check_grid(
                    sizes.get("tensor_row", 1),
                    sizes.get("tensor_col", 1),
                    sizes.get("tensor_depth", 1),
                )
            except ConfigError:
                continue
            if mode.takes_depth and sizes.get("tensor_depth", 1) == 1:
                continue  # depth 1 is the 2D grid (Tesseract with d = 1 is SUMMA)
            if sizes not in seen:
                seen.append(sizes)
                out.append((mode.name, sizes))
    return out


def _seq_modes(seq: int) -> list[str]:
    if seq == 1:
        return ["none"]
    return [m.name for m in seq_modes.TABLE if m.splits_sequence]


def _pipelines(pipe: int, batch: int) -> list[tuple[str, int | None, int]]:
    """``(schedule, microbatches, virtual stages)`` for ``pipe`` stages and a global batch."""
    if pipe == 1:
        return [("none", None, 1)]
    out = []
    for sched in pipelines.TABLE:
        if not sched.pipelined:
            continue
        for f in MICROBATCH_FACTORS:
            m = f * pipe
            if m > batch:
                continue
            for v in VIRTUAL_STAGES if sched.virtual else (1,):
                out.append((sched.name, m, v))
    return out


def layouts(n: int, batch: int, node: int) -> Iterator[ParallelConfig]:
    """Every layout of :mod:`this module's <colossal_jax.auto.space>` enumeration for ``n``
    devices and a global ``batch``, with tensor and sequence groups of at most ``node``
    devices; ZeRO 0 (:func:`knobs` varies it). Not yet checked by the rules."""
    for data, pipe, tensor, seq in factorizations(n, 4):
        if tensor > node or seq > node or tensor * seq > node:
            continue
        for (mode, sizes), smode, (sched, m, v) in itertools.product(
            tensor_grids(tensor), _seq_modes(seq), _pipelines(pipe, batch)
        ):
            yield ParallelConfig(
                data=data,
                pipe=pipe,
                seq=seq,
                **sizes,
                tensor_mode=mode,
                seq_mode=smode,
                pipeline=sched,
                microbatches=m,
                virtual_stages=v,
            )


def knobs(par: ParallelConfig, batch: int, microbatches: int) -> list[Knobs]:
    """Every memory-knob combination for the layout ``par``: ZeRO 1–3 only with ``data > 1``,
    offload ``params`` only with ZeRO-3, accumulation in powers of two while each of the
    ``batch_shards · microbatches · accum`` pieces keeps one sequence."""
    zeros = (0, 1, 2, 3) if par.data > 1 else (0,)
    accums = []
    a = 1
    while batch % (microbatches * a) == 0 and batch // (microbatches * a) >= 1:
        accums.append(a)
        a *= 2
    if par.pipelined and par.num_microbatches < MICROBATCH_FACTORS[-1] * par.pipe:
        # accumulation is more microbatches through the schedule (M·accum): below the
        # largest M searched, the layout with the larger M already runs that schedule
        accums = accums[:1]
    out = []
    for z, r, o, a in itertools.product(zeros, REMATS, OFFLOADS, accums):
        if o == "params" and z != 3:
            continue
        if r == "offload" and par.pipelined:
            continue  # does not compile: the pipeline's tick buffer meets pinned-host residuals
        out.append(Knobs(z, r, o, a))
    return out


def describe(par: ParallelConfig) -> str:
    """A short name of a layout: the axes above 1 and the modes they run."""
    axes = par.short()
    modes = []
    if par.tensor_mode != "none":
        modes.append(f"tp={par.tensor_mode}")
    if par.seq_mode != "none":
        modes.append(f"sp={par.seq_mode}")
    if par.pipe > 1:
        sched = f"pp={par.pipeline}/M{par.num_microbatches}"
        if par.virtual_stages > 1:
            sched += f"/V{par.virtual_stages}"
        modes.append(sched)
    return " ".join([axes, *modes])
