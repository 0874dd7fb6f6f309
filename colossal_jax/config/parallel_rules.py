"""The rules of the parallel configuration that need no model: axis sizes and mode names, the
device count, tensor grid shapes and the ``tensor=N`` shorthand, collective matmul, the pipeline
schedule and microbatches, and the sequence split (zigzag chunks, Ulysses heads).

Each rule raises :class:`~colossal_jax.config.errors.ConfigError` naming the bad value and a
valid alternative; kernels call the same functions with their own sizes rather than restating a
condition.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from colossal_jax.config.choices import (
    COLLECTIVE_MATMUL_MODES,
    PIPELINES,
    SEQ_MODES,
    TENSOR_AXES,
    TENSOR_MODES,
)
from colossal_jax.config.errors import ConfigError, choice

if TYPE_CHECKING:
    from colossal_jax.config.schema import ParallelConfig


def check_parallel(par: ParallelConfig, n_devices: int | None = None) -> None:
    """Axis sizes, mode names, ZeRO, the pipeline, the device count and the tensor grid."""
    for a, n in par.axis_sizes.items():
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"mesh axis {a}={n!r} must be a positive integer")
    if par.tensor_mode not in TENSOR_MODES:
        raise ConfigError(choice("--tensor-mode", par.tensor_mode, TENSOR_MODES))
    if par.seq_mode not in SEQ_MODES:
        raise ConfigError(choice("--seq-mode", par.seq_mode, SEQ_MODES))
    if par.zero not in (0, 1, 2, 3):
        raise ConfigError(f"--zero {par.zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    check_pipeline(par)
    if n_devices is not None and par.size != n_devices:
        raise ConfigError(
            f"the mesh {par.short()} has {par.size} devices but {n_devices} are available; "
            f"make the axis sizes multiply to {n_devices} (e.g. data={n_devices})"
        )
    if par.tensor_mode == "none" and par.tensor_size > 1:
        raise ConfigError(
            f"tensor axes {par.short(TENSOR_AXES)} are set "
            "but --tensor-mode is none; pass --tensor-mode 1d|2d|2.5d|3d"
        )
    check_grid(par.tensor_mode, par.tensor_row, par.tensor_col, par.tensor_depth)
    check_collective_matmul(par)
    if par.seq_mode == "none" and par.seq > 1:
        raise ConfigError(
            f"seq={par.seq} but --seq-mode is none; pass --seq-mode ring|ulysses|"
            "ring-self-attention"
        )


def check_grid(mode: str, r: int, c: int, d: int) -> None:
    """The grid shape ``mode`` needs from tensor_row × tensor_col × tensor_depth = r × c × d."""
    if mode == "2d" and (r != c or d != 1):
        raise ConfigError(
            f"2d needs a square grid tensor_row == tensor_col and tensor_depth=1, got "
            f"tensor_row={r}, tensor_col={c}, tensor_depth={d}; e.g. tensor_row=2,tensor_col=2"
        )
    if mode == "2.5d" and r != c:
        raise ConfigError(
            f"2.5d needs tensor_row == tensor_col (a q×q grid stacked tensor_depth times), got "
            f"tensor_row={r}, tensor_col={c}"
        )
    if mode == "3d" and not (r == c == d):
        raise ConfigError(
            f"3d needs a cube tensor_row == tensor_col == tensor_depth, got {r}×{c}×{d}; "
            "e.g. tensor=8 gives 2×2×2"
        )


def check_collective_matmul(par: ParallelConfig) -> None:
    """``--collective-matmul on`` decomposes the tensor linears' collectives, so it needs a
    tensor mode that has them (every mode but ``none``)."""
    if not isinstance(par.collective_matmul, bool):
        raise ConfigError(
            f"--collective-matmul {par.collective_matmul!r} is not on or off; e.g. "
            "--collective-matmul on"
        )
    if par.collective_matmul and par.tensor_mode not in COLLECTIVE_MATMUL_MODES:
        raise ConfigError(
            f"--collective-matmul on decomposes the collectives of tensor-parallel linears, but "
            f"--tensor-mode is {par.tensor_mode}; use --tensor-mode "
            f"{'|'.join(COLLECTIVE_MATMUL_MODES)} (e.g. --mesh tensor=8 --tensor-mode 1d "
            "--collective-matmul on) or --collective-matmul off"
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
    rule for a total), or raise naming a total that factors."""
    if mode in ("none", "1d"):
        if mode == "none" and total > 1:
            raise ConfigError(
                f"--mesh tensor={total} needs --tensor-mode 1d|2d|2.5d|3d to say how to split it; "
                f"e.g. --mesh tensor={total} --tensor-mode 1d"
            )
        return {"tensor_row": total}
    if mode == "2d":
        q = math.isqrt(total)
        if q * q != total:
            raise ConfigError(
                f"tensor={total} is not a square, as 2d needs (q×q); use tensor={q * q} or "
                f"{(q + 1) ** 2}"
            )
        return {"tensor_row": q, "tensor_col": q}
    if mode == "2.5d":
        d = depth or 1
        if total % d:
            raise ConfigError(f"tensor={total} is not divisible by --tensor-depth {d}")
        q = math.isqrt(total // d)
        if q * q * d != total:
            raise ConfigError(
                f"tensor={total} is not q×q×{d} for any q; 2.5d needs tensor = q²·depth "
                f"(e.g. tensor={4 * d} for q=2)"
            )
        return {"tensor_row": q, "tensor_col": q, "tensor_depth": d}
    if mode == "3d":
        q = round(total ** (1 / 3))
        if q**3 != total:
            raise ConfigError(f"tensor={total} is not a cube, as 3d needs (q×q×q); use 8 or 64")
        return {"tensor_row": q, "tensor_col": q, "tensor_depth": q}
    raise ConfigError(choice("--tensor-mode", mode, TENSOR_MODES))


def check_pipeline(par: ParallelConfig) -> None:
    """The pipeline rules that need no model (the layer count is in :func:`check_run`)."""
    p, name, v = par.pipe, par.pipeline, par.virtual_stages
    if name not in PIPELINES:
        raise ConfigError(choice("--pipeline", name, PIPELINES))
    if p == 1:
        if name != "none":
            raise ConfigError(
                f"--pipeline {name} needs a pipe axis; add pipe=N to --mesh (e.g. "
                "--mesh pipe=2,data=4) or use --pipeline none"
            )
        if par.microbatches not in (None, 1) or v != 1:
            raise ConfigError(
                "--microbatches/--virtual-stages apply to pipelines; add pipe=N to --mesh"
            )
        return
    if name == "none":
        raise ConfigError(
            f"pipe={p} needs a schedule; use --pipeline 1f1b (the default), gpipe or interleaved"
        )
    m = par.num_microbatches
    if m < p:
        raise ConfigError(
            f"--microbatches {m} is smaller than pipe={p}: the pipeline would never fill; "
            f"use --microbatches {p} or more (e.g. {2 * p})"
        )
    if name == "interleaved":
        if v < 2:
            raise ConfigError(
                f"--pipeline interleaved needs --virtual-stages 2 or more, got {v}; use "
                "--virtual-stages 2 (or --pipeline 1f1b)"
            )
        if m % p:
            raise ConfigError(
                f"--pipeline interleaved sends microbatches in groups of pipe={p}; "
                f"--microbatches {m} is not a multiple of {p}; use --microbatches "
                f"{p * max(1, round(m / p))}"
            )
    elif v != 1:
        raise ConfigError(
            f"--virtual-stages {v} needs --pipeline interleaved (got --pipeline {name})"
        )


def check_axes_for_modes(par: ParallelConfig) -> None:
    """A sequence or tensor mode needs its axes in the mesh."""
    if par.seq_mode != "none" and par.seq == 1:
        raise ConfigError(
            f"--seq-mode {par.seq_mode} needs a seq axis, but the mesh {par.short()} has "
            f"seq=1; add one, e.g. --mesh data=2,seq=4, or omit --seq-mode"
        )
    if par.tensor_mode != "none" and par.tensor_size == 1:
        raise ConfigError(
            f"--tensor-mode {par.tensor_mode} needs tensor axes, but the mesh {par.short()} "
            f"has none; add them, e.g. --mesh tensor=4 --tensor-mode {par.tensor_mode}"
            f"{' --tensor-depth 1' if par.tensor_mode == '2.5d' else ''}, or omit --tensor-mode"
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
    return par.seq_mode == "ring" and par.seq > 1 and is_causal(model)


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
