"""The rules of the parallel configuration that need no model: axis sizes and mode names, the
device count, tensor grid shapes and the ``tensor=N`` shorthand, collective matmul, the pipeline
schedule and microbatches, and the sequence split (zigzag chunks, Ulysses heads).

Each rule raises :class:`~colossal_jax.config.errors.ConfigError` naming the bad value and a
valid alternative; kernels call the same functions with their own sizes rather than restating a
condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colossal_jax.config import pipelines, seq_modes, tensor_modes
from colossal_jax.config.choices import TENSOR_AXES
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.pipelines import pipeline_schedule
from colossal_jax.config.seq_modes import seq_mode
from colossal_jax.config.tensor_modes import tensor_mode

if TYPE_CHECKING:
    from colossal_jax.config.schema import ParallelConfig


def check_parallel(par: ParallelConfig, n_devices: int | None = None) -> None:
    """Axis sizes, mode names, ZeRO, the pipeline, the device count and the tensor grid."""
    for a, n in par.axis_sizes.items():
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"mesh axis {a}={n!r} must be a positive integer")
    tensor, seq = tensor_mode(par.tensor_mode), seq_mode(par.seq_mode)
    if par.zero not in (0, 1, 2, 3):
        raise ConfigError(f"--zero {par.zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    check_pipeline(par)
    if n_devices is not None and par.size != n_devices:
        raise ConfigError(
            f"the mesh {par.short()} has {par.size} devices but {n_devices} are available; "
            f"make the axis sizes multiply to {n_devices} (e.g. data={n_devices})"
        )
    if not tensor.splits_tensor and par.tensor_size > 1:
        raise ConfigError(
            f"tensor axes {par.short(TENSOR_AXES)} are set but --tensor-mode is {tensor.name}; "
            f"pass --tensor-mode {'|'.join(tensor_modes.splitting_modes())}"
        )
    tensor.check_grid(par.tensor_row, par.tensor_col, par.tensor_depth)
    check_collective_matmul(par)
    if not seq.splits_sequence and par.seq > 1:
        raise ConfigError(
            f"seq={par.seq} but --seq-mode is {seq.name}; pass --seq-mode "
            f"{'|'.join(seq_modes.splitting_modes())}"
        )


def check_grid(mode: str, r: int, c: int, d: int) -> None:
    """The grid shape ``mode`` needs from tensor_row × tensor_col × tensor_depth = r × c × d
    (:meth:`~colossal_jax.config.tensor_modes.TensorMode.check_grid`)."""
    tensor_mode(mode).check_grid(r, c, d)


def check_collective_matmul(par: ParallelConfig) -> None:
    """``--collective-matmul on`` decomposes the tensor linears' collectives, so it needs a
    tensor mode that has them (every mode but ``none``)."""
    if not isinstance(par.collective_matmul, bool):
        raise ConfigError(
            f"--collective-matmul {par.collective_matmul!r} is not on or off; e.g. "
            "--collective-matmul on"
        )
    if par.collective_matmul and not tensor_mode(par.tensor_mode).splits_tensor:
        splitting = tensor_modes.splitting_modes()
        raise ConfigError(
            f"--collective-matmul on decomposes the collectives of tensor-parallel linears, but "
            f"--tensor-mode is {par.tensor_mode}; use --tensor-mode {'|'.join(splitting)} (e.g. "
            f"--mesh tensor=8 --tensor-mode {splitting[0]} --collective-matmul on) or "
            "--collective-matmul off"
        )


def check_ring_blocks(mode: str, what: str, size: int, n: int) -> None:
    """A collective-matmul ring cuts ``size`` (``what``) into ``n`` equal blocks."""
    if size % n:
        up = -(-size // n) * n
        raise ConfigError(
            f"--collective-matmul on with {mode} cuts the {what} ({size}) into {n} ring blocks; "
            f"{size} is not divisible by {n}: use a {what} of {up}, or --collective-matmul off"
        )


def factor_tensor(total: int, mode: str, depth: int | None) -> dict[str, int]:
    """Split the shorthand ``tensor=N`` into tensor_row/col/depth for ``mode`` (the grid-shape
    rule for a total, :meth:`~colossal_jax.config.tensor_modes.TensorMode.factor`), or raise
    naming a total that factors."""
    return tensor_mode(mode).factor(total, depth)


def check_pipeline(par: ParallelConfig) -> None:
    """The pipeline rules that need no model (the layer count is in :func:`check_run`)."""
    p, v = par.pipe, par.virtual_stages
    schedule = pipeline_schedule(par.pipeline)
    name = schedule.name
    if p == 1:
        if schedule.pipelined:
            raise ConfigError(
                f"--pipeline {name} needs a pipe axis; add pipe=N to --mesh (e.g. "
                "--mesh pipe=2,data=4) or use --pipeline none"
            )
        if par.microbatches not in (None, 1) or v != 1:
            raise ConfigError(
                "--microbatches/--virtual-stages apply to pipelines; add pipe=N to --mesh"
            )
        return
    if not schedule.pipelined:
        raise ConfigError(
            f"pipe={p} needs a schedule; use --pipeline {'|'.join(_schedules(lambda s: True))}, "
            "or omit --pipeline for the default"
        )
    m = par.num_microbatches
    if m < p:
        raise ConfigError(
            f"--microbatches {m} is smaller than pipe={p}: the pipeline would never fill; "
            f"use --microbatches {p} or more (e.g. {2 * p})"
        )
    if schedule.virtual:
        if v < 2:
            plain = "|".join(_schedules(lambda s: not s.virtual))
            raise ConfigError(
                f"--pipeline {name} needs --virtual-stages 2 or more, got {v}; use "
                f"--virtual-stages 2 (or --pipeline {plain})"
            )
        if m % p:
            raise ConfigError(
                f"--pipeline {name} sends microbatches in groups of pipe={p}; "
                f"--microbatches {m} is not a multiple of {p}; use --microbatches "
                f"{p * max(1, round(m / p))}"
            )
    elif schedule.chunks is not None:
        if v != schedule.chunks:
            raise ConfigError(
                f"--pipeline {name} runs exactly {schedule.chunks} chunks per stage; use "
                f"--virtual-stages {schedule.chunks} (got {v})"
            )
    elif v != 1:
        chunked = "|".join(_schedules(lambda s: s.virtual or s.chunks))
        raise ConfigError(f"--virtual-stages {v} needs --pipeline {chunked} (got {name})")


def _schedules(where) -> tuple[str, ...]:
    """The names of the pipelined schedules ``where`` accepts."""
    return tuple(pipelines.TABLE.names(lambda s: s.pipelined and where(s)))


def check_axes_for_modes(par: ParallelConfig) -> None:
    """A sequence or tensor mode needs its axes in the mesh."""
    seq, tensor = seq_mode(par.seq_mode), tensor_mode(par.tensor_mode)
    if seq.splits_sequence and par.seq == 1:
        raise ConfigError(
            f"--seq-mode {seq.name} needs a seq axis, but the mesh {par.short()} has "
            f"seq=1; add one, e.g. --mesh data=2,seq=4, or omit --seq-mode"
        )
    if tensor.splits_tensor and par.tensor_size == 1:
        raise ConfigError(
            f"--tensor-mode {tensor.name} needs tensor axes, but the mesh {par.short()} "
            f"has none; add them, e.g. --mesh tensor=4 --tensor-mode {tensor.name}"
            f"{' --tensor-depth 1' if tensor.takes_depth else ''}, or omit --tensor-mode"
        )


def is_causal(model: Any) -> bool:
    """Whether ``model``'s attention is causal: a model config declares ``causal = False``
    (a field or property) for bidirectional attention (BERT, ViT); GPT-style configs, which
    declare nothing, are causal."""
    return bool(getattr(model, "causal", True))


def uses_zigzag(par: ParallelConfig, model: Any) -> bool:
    """Ring attention reorders the sequence in zigzag order (:mod:`colossal_jax.sequence.zigzag`)
    only for a causal model: zigzag balances the work the *causal* mask leaves per device.
    Without the mask every device already does the same ``p`` blocks, so a bidirectional model
    keeps the contiguous order (the plain ring), which needs ``seq_len`` divisible by ``seq``
    only, not ``2·seq``."""
    return seq_mode(par.seq_mode).zigzag and par.seq > 1 and is_causal(model)


def check_seq_split(seq_len: int, seq: int, *, zigzag: bool) -> None:
    """``seq_len`` splits into ``seq`` equal blocks, or ``2·seq`` zigzag chunks for causal ring
    attention (:mod:`colossal_jax.sequence.zigzag`)."""
    if seq < 1:
        raise ConfigError(f"the number of sequence-parallel devices p={seq} must be >= 1")
    chunks = seq * (2 if zigzag else 1)
    if seq_len > 0 and seq_len % chunks == 0:
        return
    lower = seq_len // chunks * chunks
    alt = f"{lower + chunks}" if lower <= 0 else f"{lower} or {lower + chunks}"
    why = f"2·seq zigzag chunks, 2*p={chunks} for p={seq}" if zigzag else "seq"
    raise ConfigError(
        f"--seq-len {seq_len} is not divisible by {chunks} ({why}); use --seq-len {alt}"
    )


def check_ulysses_heads(heads: int, seq: int, head_split: int = 1) -> None:
    """Ulysses re-splits each tensor shard's ``heads / head_split`` query heads over ``seq``.
    Key/value heads of grouped-query attention need no rule: where ``seq`` does not divide them
    the kernel repeats them to ``lcm(kv_heads, seq)`` heads (:mod:`colossal_jax.sequence.ulysses`),
    which divides the query heads whenever this rule holds."""
    local = heads // max(head_split, 1)
    if local % seq:
        raise ConfigError(
            f"ulysses needs the heads per tensor shard ({local}) divisible by seq={seq} (the "
            f"sequence-parallel size p={seq}); use --seq-mode ring or n_head divisible by "
            f"{seq * head_split}"
        )
