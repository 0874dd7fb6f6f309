"""Every configuration rule that needs no devices, in one place.

A rule is a check of the configuration (a :class:`~colossal_jax.config.TrainConfig`, its
:class:`~colossal_jax.config.ParallelConfig` and the resolved model config) that can be decided
from numbers alone. Each rule lives here once and raises :class:`ConfigError` (a ``ValueError``)
naming the bad value and a valid alternative. The rest of the library calls these functions
instead of keeping copies: the config dataclasses' ``validate`` methods, ``config.parse_mesh``
(the ``tensor=N`` shorthand), the tensor layouts (grid shapes, model divisibility, head split),
the sequence kernels (Ulysses heads, zigzag chunks) and ``train.validate_run``, which adds the
one check that needs devices (their memory) and passes its capacity to :func:`check_memory`.

This module imports no JAX (nor Flax or NumPy), so ``cli.main`` runs :func:`check_config` on the
whole run before JAX starts. Topics, in the order :func:`check_config` applies them:

- parallel: axis sizes, mode names, ZeRO, device count, tensor grid shapes, seq axis, pipeline
  (:func:`check_parallel`, :func:`check_grid`, :func:`factor_tensor`, :func:`check_pipeline`);
- training and optimizer fields (:func:`check_train`, :func:`check_optim`), and the memory
  modes: remat, gradient accumulation, offload and their combinations with ZeRO and the
  pipeline (:func:`check_memory_modes`);
- model dimensions (:func:`check_model`);
- the run: sequence length against the model, batch shards, sequence split, pipeline chunks and
  microbatches, Ulysses heads, the tensor mode's divisibility of hidden/mlp/heads/vocab, learned
  positions (:func:`check_run`, :func:`tensor_split`, :func:`batch_shards`);
- memory: the training-state floor against a capacity (:func:`check_memory`);
- initialisation from a Hugging Face directory: its family, the options our model computes, its
  weights, and ``--set model.*`` against its architecture (:func:`check_init_from_hf`,
  :func:`model_overrides`).

Later features add their rules here: a new function in the matching topic (or a new topic) that
raises ``ConfigError`` with the flag, the bad value and an example that works, called from the
topic's ``check_*`` function so that :func:`check_config` — and so the command line, before JAX —
runs it. Code that needs the same rule at a lower level (a kernel, a layout) calls the function
with its own sizes rather than restating the condition.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from colossal_jax.config import (
    ATTENTION_IMPLS,
    OFFLOADS,
    OPTIMIZERS,
    PIPELINES,
    PRECISIONS,
    REMATS,
    SEQ_MODES,
    TENSOR_MODES,
    ConfigError,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    param_count,
    state_bytes,
    suggest,
)

TENSOR_AXES = ("tensor_row", "tensor_col", "tensor_depth")


def check_config(
    cfg: TrainConfig,
    model: Any = None,
    n_devices: int | None = None,
    memory: tuple[int, int] | None = None,
) -> None:
    """Every device-free rule of ``cfg``: the parallel config (against ``n_devices`` when
    given), the training and optimizer fields and, with a resolved ``model`` (any family's
    config), the model, task and run rules; with ``memory = (capacity bytes, devices sharing
    it)`` also the training-state floor."""
    check_parallel(cfg.parallel, n_devices)
    check_train(cfg)
    if model is not None:
        check_with_model(cfg, model, memory)


def check_with_model(cfg: TrainConfig, model: Any, memory: tuple[int, int] | None = None) -> None:
    """The rules that need the resolved model, for a ``cfg`` that passed the others: its
    dimensions, the memory floor (given ``memory``), then the run's divisibilities."""
    check_model(model, _models()[cfg.model], cfg.model_overrides)
    check_task(cfg, model)
    if memory is not None:
        check_memory(cfg, model, *memory)
    check_run(cfg, model)


# ---- parallel -----------------------------------------------------------------------------------


def choice(flag: str, value: Any, valid: tuple[str, ...]) -> str:
    """The message for ``value`` not among ``valid`` (with a near miss suggested)."""
    return f"{flag} {value!r} is not one of {', '.join(valid)}{suggest(value, valid, '; ')}"


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


COLLECTIVE_MATMUL_MODES = ("1d", "2d", "2.5d", "3d")


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


# ---- training and optimizer fields --------------------------------------------------------------


def check_train(cfg: TrainConfig) -> None:
    """The TrainConfig fields (the optimizer's too) and the modes that need an axis."""
    if cfg.steps < 1:
        raise ConfigError(f"--steps {cfg.steps} must be at least 1 (e.g. --steps 100)")
    if cfg.batch_size < 1:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} must be at least 1 (e.g. --batch-size 16)"
        )
    if cfg.seq_len < 2:
        raise ConfigError(f"--seq-len {cfg.seq_len} must be at least 2 (e.g. --seq-len 128)")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(choice("--precision", cfg.precision, PRECISIONS))
    check_memory_modes(cfg)
    if cfg.attention not in ATTENTION_IMPLS:
        raise ConfigError(choice("--attention", cfg.attention, ATTENTION_IMPLS))
    par = cfg.parallel
    if cfg.attention == "cudnn" and par.seq > 1 and par.seq_mode in ("ring", "ring-self-attention"):
        raise ConfigError(
            f"--attention cudnn cannot run inside --seq-mode {par.seq_mode} (its "
            "blocks are masked by position and combined by log-sum-exp); use --attention auto "
            "or --seq-mode ulysses"
        )
    if cfg.optim.name not in OPTIMIZERS:
        raise ConfigError(choice("--optimizer", cfg.optim.name, OPTIMIZERS))
    if not (math.isfinite(cfg.optim.lr) and cfg.optim.lr > 0):
        raise ConfigError(f"--lr {cfg.optim.lr} must be positive and finite (e.g. --lr 3e-3)")
    check_optim(cfg.optim)
    if cfg.checkpoint_every < 1:
        raise ConfigError(
            f"--checkpoint-every {cfg.checkpoint_every} must be at least 1 "
            "(e.g. --checkpoint-every 50)"
        )
    check_keep_checkpoints(cfg.keep_checkpoints)
    if cfg.xla_preset is not None:
        check_xla_preset(cfg.xla_preset)
    check_profile(cfg.profile_dir, cfg.profile_steps, cfg.steps)
    _check_run_fields(cfg)
    check_axes_for_modes(par)
    check_init_from_hf(cfg)


def check_keep_checkpoints(keep: int) -> None:
    """``--keep-checkpoints K``: at least the latest one (2 or more leave one to fall back on when
    the latest is damaged)."""
    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(
            f"--keep-checkpoints {keep} must be at least 1 (the latest is what a re-run resumes "
            "from; 2 or more leave one to fall back on); e.g. --keep-checkpoints 3"
        )


MAX_PEER_TIMEOUT = 3600
"""The longest ``--peer-timeout`` accepted (an hour: beyond it a lost peer looks like a hang)."""


def check_peer_timeout(seconds: float) -> None:
    """``--peer-timeout S``: how long a multi-process run waits on a silent peer (its missed
    heartbeats, or a step that does not finish) before it exits; 5 s to an hour. Shorter than a
    step or a compilation would kill healthy runs; very long ones look like a hang."""
    if not isinstance(seconds, int | float) or not 5 <= seconds <= MAX_PEER_TIMEOUT:
        raise ConfigError(
            f"--peer-timeout {seconds} must be between 5 and {MAX_PEER_TIMEOUT} seconds (longer "
            "than the slowest step); e.g. --peer-timeout 120"
        )


def check_memory_modes(cfg: TrainConfig) -> None:
    """``--remat``, ``--grad-accum``, ``--offload`` and how they combine with ZeRO and the
    pipeline."""
    if cfg.remat not in REMATS:
        raise ConfigError(choice("--remat", cfg.remat, REMATS))
    if cfg.offload not in OFFLOADS:
        raise ConfigError(choice("--offload", cfg.offload, OFFLOADS))
    if not isinstance(cfg.grad_accum, int) or cfg.grad_accum < 1:
        raise ConfigError(
            f"--grad-accum {cfg.grad_accum} must be at least 1 (1: no accumulation; e.g. "
            "--grad-accum 4)"
        )
    if cfg.device_batch is not None and (
        not isinstance(cfg.device_batch, int) or cfg.device_batch < 1
    ):
        raise ConfigError(
            f"--device-batch {cfg.device_batch} must be at least 1 (sequences per batch shard "
            "per microbatch; e.g. --device-batch 2), or omit it"
        )
    par = cfg.parallel
    if cfg.offload == "params" and par.zero != 3:
        raise ConfigError(
            f"--offload params keeps ZeRO-3's parameter shards in host memory, but --zero is "
            f"{par.zero}; add --zero 3, or use --offload optimizer"
        )


def check_optim(o: OptimConfig) -> None:
    """Values no optimizer can use: negative decay or clipping, moments outside [0, 1)."""
    if o.warmup_steps < 0:
        raise ConfigError(
            f"--warmup-steps {o.warmup_steps} must be 0 or more (e.g. --warmup-steps 20)"
        )
    for flag, value, example, what in (
        ("--weight-decay", o.weight_decay, "0.01", "0 turns it off"),
        ("--clip-norm", o.clip_norm, "1.0", "0 turns clipping off"),
        ("--set optim.eps=", o.eps, "1e-8", "added to the denominator"),
        ("--set optim.min_lr_ratio=", o.min_lr_ratio, "0.1", "final lr / peak lr"),
    ):
        if not (math.isfinite(value) and value >= 0):
            sep = "" if flag.endswith("=") else " "
            raise ConfigError(
                f"{flag}{sep}{value} must be a finite number ≥ 0 ({what}); e.g. "
                f"{flag}{sep}{example}"
            )
    for key, value, example in (("b1", o.b1, 0.9), ("b2", o.b2, 0.95)):
        if not 0 <= value < 1:
            raise ConfigError(
                f"--set optim.{key}={value} must be in [0, 1); e.g. --set optim.{key}={example}"
            )
    if not (math.isfinite(o.lars_trust) and o.lars_trust > 0):
        raise ConfigError(
            f"--set optim.lars_trust={o.lars_trust} must be positive; e.g. "
            "--set optim.lars_trust=0.001"
        )


HOST_OVERLAP = ("auto", "on", "off")
"""``TrainConfig.host_overlap``: the training loop's order (:func:`host_overlap`)."""


def host_overlap(setting: str, platform: str) -> bool:
    """Whether the training loop overlaps its host work with the step in flight: ``on``,
    ``off``, or ``auto`` — on unless ``platform`` (``jax.default_backend()``) is ``cpu``,
    whose "devices" are threads on the host's own cores."""
    if setting == "auto":
        return platform != "cpu"
    return setting == "on"


def _check_run_fields(cfg: TrainConfig) -> None:
    if not 0 <= cfg.seed < 2**63:
        raise ConfigError(f"--seed {cfg.seed} must be in [0, 2**63) (e.g. --seed 0)")
    if cfg.host_overlap not in HOST_OVERLAP:
        raise ConfigError(choice("--set host_overlap", cfg.host_overlap, HOST_OVERLAP))
    if cfg.log_every < 1:
        raise ConfigError(
            f"--set log_every={cfg.log_every} must be at least 1 (e.g. --set log_every=10)"
        )
    if cfg.eval_every < 0:
        raise ConfigError(
            f"--eval-every {cfg.eval_every} must be 0 (off) or more (e.g. --eval-every 50)"
        )
    if cfg.eval_batches < 1:
        raise ConfigError(
            f"--set eval_batches={cfg.eval_batches} must be at least 1 (e.g. --set eval_batches=4)"
        )
    if cfg.peak_tflops is not None and not (math.isfinite(cfg.peak_tflops) and cfg.peak_tflops > 0):
        raise ConfigError(
            f"--peak-tflops {cfg.peak_tflops} must be a positive number of dense bf16 "
            "TFLOP/s per device (e.g. --peak-tflops 989 for an H100)"
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


# ---- model --------------------------------------------------------------------------------------

MAY_BE_ZERO = ("type_vocab_size",)
"""Integer model fields where 0 turns a part off (BERT's token-type embedding)."""


def check_model(model: Any, base: Any, overrides: dict[str, Any]) -> None:
    """Model dimensions no mesh can fix. ``model`` and ``base`` (the named model) are configs of
    one family (:class:`models.registry.ModelConfig`); ``overrides`` the ``--set model.*``
    values, so the message names the flag that was given."""
    for f in dataclasses.fields(model):
        example = getattr(base, f.name)
        value = getattr(model, f.name)
        if isinstance(example, bool) or not isinstance(example, int | float):
            continue
        if isinstance(example, int):
            least = 0 if f.name in MAY_BE_ZERO else 1
            if not isinstance(value, int) or value < least:
                what = "a positive integer" if least else "an integer ≥ 0"
                raise ConfigError(
                    f"--set model.{f.name}={value} must be {what}; e.g. "
                    f"--set model.{f.name}={example}"
                )
            continue
        least = 1.0 if f.name == "rope_theta" else 0.0
        if not (math.isfinite(value) and value >= least):
            raise ConfigError(
                f"--set model.{f.name}={value} must be a finite number ≥ {least:g}; e.g. "
                f"--set model.{f.name}={example}"
            )
    h, heads = model.n_embd, model.n_head
    if h % heads:
        if "n_head" in overrides and "n_embd" not in overrides:
            near = _near(heads, [d for d in range(1, h + 1) if h % d == 0])
            raise ConfigError(
                f"--set model.n_head={heads} does not divide model.n_embd={h}; use "
                f"--set model.n_head={' or '.join(map(str, near))}"
            )
        lo = max(heads, h // heads * heads)
        near = sorted({lo, h // heads * heads + heads} - {h})
        raise ConfigError(
            f"--set model.n_embd={h} is not divisible by model.n_head={heads}; use "
            f"--set model.n_embd={' or '.join(map(str, near))}"
        )
    if model.position == "rope" and (h // heads) % 2:
        raise ConfigError(
            f"--set model.position=rope needs an even head size, but n_embd/n_head = {h}/{heads} "
            f"= {h // heads}; use --set model.n_embd={h + heads} or --set model.position=learned"
        )
    patch = getattr(model, "patch_size", None)
    if patch is not None and model.image_size % patch:
        fits = [p for p in range(1, model.image_size + 1) if model.image_size % p == 0]
        near = " or ".join(map(str, _near(patch, fits)))
        raise ConfigError(
            f"--set model.patch_size={patch} does not divide model.image_size="
            f"{model.image_size}; use --set model.patch_size={near}"
        )


def _near(x: int, candidates: list[int]) -> list[int]:
    below = [c for c in candidates if c < x]
    above = [c for c in candidates if c > x]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def resolve_model(cfg: TrainConfig, data_vocab: int | None) -> Any:
    """The model config (of any family, :mod:`models.registry`): the named one, the architecture
    of ``--init-from-hf`` (if given) or else the vocabulary its task needs for data of
    ``data_vocab`` token ids (:func:`colossal_jax.tasks.model_vocab`), then ``--set model.*``; an
    unknown name or field is a ConfigError."""
    from colossal_jax.tasks import model_vocab
    from models.registry import model_config, task_of

    overrides = model_overrides(cfg)
    if cfg.init_from_hf is not None and data_vocab is not None and "vocab_size" in overrides:
        if data_vocab > overrides["vocab_size"]:
            raise ConfigError(
                f"--data {cfg.data} has token ids up to {data_vocab - 1}, but the model of "
                f"--init-from-hf {cfg.init_from_hf} has a vocabulary of "
                f"{overrides['vocab_size']}; use data tokenized for that model"
            )
    try:
        vocab = model_vocab(task_of(cfg.model), data_vocab)
        if vocab is not None and "vocab_size" not in overrides:
            overrides["vocab_size"] = vocab
        return model_config(cfg.model, **overrides)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set model.*: {e}") from None


def _models() -> dict[str, Any]:
    from models.registry import MODELS

    return MODELS


def _fields(model: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(model)}


# ---- the data task -------------------------------------------------------------------------------

IMAGE_DATA = ("digits", "shapes")
"""``--data`` of image classification: scikit-learn's 8×8 handwritten digits (generated images
where scikit-learn is not installed), or generated images at the model's size."""
DIGITS_SHAPE = (8, 1, 10)
"""Image side, channels and classes of the digits."""
MASKED_LM_MIN_SEQ = 5
"""``[CLS] A [SEP] B [SEP]`` with one token in each segment."""


def check_task(cfg: TrainConfig, model: Any) -> None:
    """The data and the sequence fit the family's task (:data:`models.registry.TASKS`)."""
    from models.registry import task_of

    task = task_of(cfg.model)
    if task == "image_classification":
        _check_images(cfg, model)
        return
    if cfg.data in IMAGE_DATA:
        raise ConfigError(
            f"--data {cfg.data} is an image set, but --model {cfg.model} trains on text ({task}); "
            "use --data stdlib, synthetic, a text file or a .npy file (./"
            f"{cfg.data} for a file of that name), or an image model, e.g. --model vit-tiny"
        )
    if task == "masked_lm":
        if cfg.seq_len < MASKED_LM_MIN_SEQ:
            raise ConfigError(
                f"--seq-len {cfg.seq_len} is too short for masked LM sequences [CLS] A [SEP] B "
                f"[SEP]; use --seq-len {MASKED_LM_MIN_SEQ} or more (e.g. 128)"
            )
        types, seq = getattr(model, "type_vocab_size", 0), cfg.parallel.seq
        if types and seq > 1:
            raise ConfigError(
                f"model.type_vocab_size={types}: a token's segment is counted from the [SEP] "
                f"tokens before it, which the sequence split seq={seq} hides from a device; use "
                "--set model.type_vocab_size=0 or a mesh without seq"
            )


def _check_images(cfg: TrainConfig, model: Any) -> None:
    if cfg.data not in IMAGE_DATA:
        raise ConfigError(
            f"--data {cfg.data}: --model {cfg.model} classifies images; use --data digits "
            "(scikit-learn's 8×8 handwritten digits) or shapes (generated at the model's size); "
            f"in Python, TrainConfig.for_model({cfg.model!r}) starts from the family's defaults"
        )
    side, channels, classes = DIGITS_SHAPE
    if cfg.data == "digits" and (
        model.image_size != side or model.channels != channels or model.num_classes < classes
    ):
        raise ConfigError(
            f"--data digits are {side}×{side}×{channels} images of {classes} classes, but "
            f"--model {cfg.model} takes {model.image_size}×{model.image_size}×{model.channels} "
            f"images of {model.num_classes}; use --data shapes (generated at the model's size) "
            "or --model vit-tiny"
        )
    if cfg.seq_len != model.seq_len:
        g = model.image_size // model.patch_size
        raise ConfigError(
            f"--seq-len {cfg.seq_len} does not fit --model {cfg.model}: an image is "
            f"{model.seq_len} tokens ({g}×{g} patches of {model.patch_size}×{model.patch_size} "
            f"pixels and the class token); use --seq-len {model.seq_len}"
        )


# ---- tensor split: what each mode divides -------------------------------------------------------


@dataclass(frozen=True)
class TensorSplit:
    """What a tensor mode on a given grid splits.

    Attributes:
      what: the split as messages name it (``2d on a 2×2 grid``).
      divisors: ``(dimension, divisor)`` pairs the model dimensions must divide by, dimensions
        named ``hidden size``, ``heads``, ``mlp width`` and ``vocab size``; one that is absent
        is not split. ``heads`` is also the head split of attention and ``vocab size`` the
        split of the embedding tables' first dimension (learned positions too).
      batch: pieces the mode itself splits the batch into (times the ``data`` axis).
    """

    what: str
    divisors: tuple[tuple[str, int], ...]
    batch: int

    def divisor(self, name: str) -> int:
        return dict(self.divisors).get(name, 1)


def tensor_split(mode: str, r: int = 1, c: int = 1, d: int = 1) -> TensorSplit:
    """The :class:`TensorSplit` of ``mode`` on tensor_row × tensor_col × tensor_depth =
    ``r × c × d``. The layouts (which own the specs) and these numbers are kept in step by
    ``tests/test_tensor_kernels.py``."""
    if mode == "1d":
        p = r * c * d
        return TensorSplit(
            f"1d tensor parallelism over {p} devices",
            (("heads", p), ("mlp width", p), ("vocab size", p)),
            1,
        )
    if mode in ("2d", "2.5d"):
        return TensorSplit(
            f"{mode} on a {r}×{r} grid",
            (("hidden size", r), ("heads", r), ("mlp width", r), ("vocab size", r)),
            r * (d if mode == "2.5d" else 1),
        )
    if mode == "3d":
        return TensorSplit(
            f"3d on a {r}×{r}×{r} cube",
            (("hidden size", r * r), ("mlp width", r * r), ("heads", r), ("vocab size", r)),
            r * r,
        )
    return TensorSplit("no tensor split", (), 1)


def split_of(par: ParallelConfig) -> TensorSplit:
    """The :class:`TensorSplit` of a ParallelConfig's tensor mode and grid."""
    return tensor_split(par.tensor_mode, par.tensor_row, par.tensor_col, par.tensor_depth)


def batch_shards(par: ParallelConfig) -> int:
    """How many pieces the batch dimension is split into: ``data`` times the tensor mode's own
    (equal to the layout's ``batch_divisor()``)."""
    return par.data * split_of(par).batch


def model_divisors(par: ParallelConfig) -> tuple[tuple[str, int], ...]:
    """``(dimension, divisor)`` pairs the model must satisfy under ``par``'s tensor mode."""
    return split_of(par).divisors


def check_split(split: TensorSplit, *, hidden: int, mlp: int, heads: int, vocab: int) -> None:
    """The model dimensions divide as ``split`` needs; the message names the first that does
    not, the split that needs it and a valid alternative."""
    if hidden % heads:
        raise ConfigError(f"hidden size {hidden} is not divisible by heads={heads}")
    values = {"hidden size": hidden, "heads": heads, "mlp width": mlp, "vocab size": vocab}
    for name, div in split.divisors:
        value = values[name]
        if value % div == 0:
            continue
        up = -(-value // div) * div
        hint = {
            "heads": f"--set model.n_head={up}",
            "vocab size": f"--set model.vocab_size={up}",
            "hidden size": f"--set model.n_embd={up} (a multiple of heads={heads} too)",
            "mlp width": f"a model.n_embd whose mlp width (mlp_ratio·n_embd) divides by {div}",
        }[name]
        raise ConfigError(
            f"{split.what} needs {name} divisible by {div}, got {value}; use {hint} or a smaller "
            "tensor split"
        )


def check_head_split(mode: str, heads: int, head_split: int) -> None:
    """Each device of a ``head_split``-way split of the attention heads holds whole heads."""
    if heads % head_split:
        raise ConfigError(
            f"{mode} splits attention heads {head_split} ways; heads={heads} is not "
            f"divisible by {head_split}"
        )


def kv_heads_of(model: Any) -> int:
    """The model's key/value heads: ``n_kv_head`` (grouped-query attention) or ``n_head``."""
    kv = getattr(model, "n_kv_head", None)
    return model.n_head if kv is None else kv


def _sizes_for_head_split(mode: str, splits: list[int], depth: int = 1) -> str:
    """Tensor-group sizes of ``mode`` whose attention head split is one of ``splits``."""
    if mode == "1d":
        return "tensor ∈ {" + ", ".join(map(str, splits)) + "}"
    if mode == "2d":
        return "tensor (q×q) ∈ {" + ", ".join(str(n * n) for n in splits) + "}"
    if mode == "2.5d":
        sizes = ", ".join(str(n * n * depth) for n in splits)
        return f"tensor (q×q×depth, depth={depth}) ∈ {{{sizes}}}"
    if mode == "3d":
        return "tensor (q×q×q) ∈ {" + ", ".join(str(n**3) for n in splits) + "}"
    return "tensor_mode none"


def check_kv_heads(mode: str, heads: int, kv_heads: int, head_split: int, depth: int = 1) -> None:
    """Grouped-query attention (Ainslie et al. 2023): ``kv_heads`` divides ``heads``, and every
    device of the ``head_split``-way head split holds whole K/V heads (``kv_heads`` divisible by
    ``head_split``; no K/V head is replicated across the tensor group). The message names the
    tensor sizes of ``mode`` that would work."""
    if kv_heads < 1 or heads % kv_heads:
        fits = [d for d in range(1, heads + 1) if heads % d == 0]
        near = _near(kv_heads, fits) if kv_heads >= 1 else [1]
        raise ConfigError(
            f"kv_heads={kv_heads} must divide heads={heads} (grouped-query attention); use "
            f"n_kv_head={' or '.join(map(str, near))}"
        )
    if kv_heads % head_split:
        ok = [n for n in range(1, kv_heads + 1) if kv_heads % n == 0]
        raise ConfigError(
            f"{mode} splits attention heads {head_split} ways, but kv_heads={kv_heads} is not "
            f"divisible by {head_split} (each device must hold whole key/value heads); use "
            f"{_sizes_for_head_split(mode, ok, depth)}, or n_kv_head divisible by {head_split}"
        )


# ---- the run: the config against the model -----------------------------------------------------


def check_run(cfg: TrainConfig, model: Any) -> None:
    """Every divisibility the mesh and modes need of the batch, the sequence and the model."""
    par = cfg.parallel
    if cfg.seq_len > model.block_size:
        fix = (
            f"(n_positions of --init-from-hf {cfg.init_from_hf})"
            if cfg.init_from_hf is not None
            else f"or --set model.block_size={cfg.seq_len}"
        )
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds the model's block_size {model.block_size}; use "
            f"--seq-len {model.block_size} {fix}"
        )
    split = batch_shards(par)
    if cfg.batch_size % split:
        good = split * max(1, round(cfg.batch_size / split))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is not divisible by the {split} batch shards of the "
            f"mesh ({par.short()}, tensor_mode={par.tensor_mode}); use --batch-size {good}"
        )
    check_device_batch(cfg)
    accum = grad_accum_of(cfg)
    if accum > 1 and not par.pipelined and cfg.batch_size % (split * accum):
        n = split * accum
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide into --grad-accum {accum} "
            f"microbatches over the {split} batch shards ({split}·{accum} = {n}); use "
            f"--batch-size {n * max(1, round(cfg.batch_size / n))} or a smaller --grad-accum"
        )
    if par.seq > 1:
        check_seq_split(cfg.seq_len, par.seq, zigzag=uses_zigzag(par, model))
    if par.pipelined:
        _check_pipeline_split(cfg, model, split)
    tensor = split_of(par)
    if par.seq_mode == "ulysses" and par.seq > 1:
        check_ulysses_heads(model.n_head, par.seq, tensor.divisor("heads"))
    try:
        check_split(
            tensor,
            hidden=model.n_embd,
            mlp=model.mlp_width,
            heads=model.n_head,
            vocab=model.vocab_size,
        )
        check_kv_heads(
            par.tensor_mode,
            model.n_head,
            kv_heads_of(model),
            tensor.divisor("heads"),
            par.tensor_depth,
        )
        embedding = tensor.divisor("vocab size")
        if model.position == "learned" and model.block_size % embedding:
            raise ConfigError(
                f"block_size {model.block_size} is not divisible by the embedding split {embedding}"
            )
    except ConfigError as e:
        raise ConfigError(f"{e} (model {cfg.model}, tensor_mode={par.tensor_mode})") from None


def grad_accum_of(cfg: TrainConfig) -> int:
    """Microbatches accumulated per optimizer step, the one place the step count of the
    accumulation is derived: ``--grad-accum``, or with ``--device-batch D`` the count that makes
    each microbatch ``D`` sequences per batch shard, ``batch_size / (batch_shards · M · D)``
    (M: the pipeline's microbatches, 1 without a pipeline). The global batch, and so the loss
    sequence, is then the same on any mesh. A batch that does not divide is refused by
    :func:`check_device_batch`; here the count is floored (at least 1)."""
    if cfg.device_batch is None:
        return cfg.grad_accum
    per_step = batch_shards(cfg.parallel) * cfg.parallel.num_microbatches * cfg.device_batch
    return max(1, cfg.batch_size // per_step)


def check_device_batch(cfg: TrainConfig) -> None:
    """``--device-batch D`` divides the sequences each batch shard gets per pipeline microbatch
    (``batch_size / (batch_shards · M)``), and agrees with an explicit ``--grad-accum`` > 1."""
    d = cfg.device_batch
    if d is None:
        return
    par = cfg.parallel
    shards, m = batch_shards(par), par.num_microbatches
    pieces = shards * m
    where = f"the {shards} batch shards of the mesh ({par.short()}, tensor_mode={par.tensor_mode})"
    if m > 1:
        where += f" × {m} pipeline microbatches"
    if cfg.batch_size % pieces:
        good = pieces * d * max(1, round(cfg.batch_size / (pieces * d)))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not split over {where} ({pieces} pieces); use "
            f"--batch-size {good} (--device-batch {d} accumulates {good // (pieces * d)} "
            "microbatches)"
        )
    per = cfg.batch_size // pieces
    if per % d:
        fits = [k for k in range(1, per + 1) if per % k == 0]
        near = _near(d, fits) if d <= per else [per]
        good = pieces * d * max(1, round(cfg.batch_size / (pieces * d)))
        raise ConfigError(
            f"--device-batch {d} does not divide the {per} sequences per shard of --batch-size "
            f"{cfg.batch_size} over {where}; use --device-batch {' or '.join(map(str, near))}, "
            f"or --batch-size {good}"
        )
    if cfg.grad_accum > 1 and cfg.grad_accum != per // d:
        raise ConfigError(
            f"--grad-accum {cfg.grad_accum} contradicts --device-batch {d}: --batch-size "
            f"{cfg.batch_size} over {where} is {per // d} microbatches of {d} sequences per "
            f"shard; omit --grad-accum (--device-batch derives it) or use --grad-accum {per // d}"
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


def _check_pipeline_split(cfg: TrainConfig, model: Any, split: int) -> None:
    # gradient accumulation composes with a pipeline as more microbatches per step
    par, accum = cfg.parallel, grad_accum_of(cfg)
    m = par.num_microbatches * accum
    chunks = par.pipe * par.virtual_stages
    if model.n_layer % chunks:
        good = chunks * max(1, round(model.n_layer / chunks))
        what = f"pipe={par.pipe}" + (
            f" × virtual_stages={par.virtual_stages}" if par.virtual_stages > 1 else ""
        )
        raise ConfigError(
            f"n_layer={model.n_layer} does not split into {chunks} equal pipeline chunks "
            f"({what}); use --set model.n_layer={good} or another pipe size"
        )
    if cfg.batch_size % (split * m):
        good = split * m * max(1, round(cfg.batch_size / (split * m)))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} does not divide into {m} microbatches over the "
            f"{split} batch shards ({split}·{m} = {split * m}); use --batch-size {good} or "
            "fewer --microbatches" + (" / --grad-accum" if accum > 1 else "")
        )


# ---- memory -------------------------------------------------------------------------------------


def check_memory(cfg: TrainConfig, model: Any, capacity: int, sharing: int = 1) -> None:
    """Refuse a model whose training state alone exceeds the memory: ``capacity`` bytes shared by
    ``sharing`` devices (simulated CPU devices share the host's memory). The caller measures the
    capacity (``train.validate_run`` asks the devices)."""
    need = state_bytes(cfg, model)
    if need * sharing <= capacity:
        return
    from models.registry import family_of

    sized = {
        name: (
            dataclasses.replace(b, vocab_size=model.vocab_size) if "vocab_size" in _fields(b) else b
        )
        for name, b in family_of(cfg.model).sizes.items()
    }
    fits = sorted(
        (param_count(b), name)
        for name, b in sized.items()
        if state_bytes(cfg, b) * sharing <= capacity
    )
    where = (
        f"the {sharing} devices of this host share {capacity / 1e9:.1f} GB"
        if sharing > 1
        else f"a device has {capacity / 1e9:.1f} GB"
    )
    alternative = f"e.g. --model {fits[-1][1]}" if fits else "a smaller --model"
    raise ConfigError(
        f"--model {cfg.model} ({param_count(model) / 1e9:.2f}B parameters) needs at least "
        f"{need / 1e9:.1f} GB per device for fp32 parameters, gradients and {cfg.optim.name} "
        f"state on the mesh {cfg.parallel.short()}, but {where}; use {alternative}, more tensor "
        "parallelism, or --zero 3"
    )


# ---- benchmarks (scripts/bench_throughput.py) ----------------------------------------------------

BASELINES = ("plain-jax", "torch", "none")


def check_bench(baseline: str, timed_steps: int, warmup: int, loop_repeats: int = 1) -> None:
    """The harness's own flags: a known baseline, at least 2 timed steps, no negative warm-up,
    at least one loop window."""
    if loop_repeats < 1:
        raise ConfigError(
            f"--loop-repeats {loop_repeats} measures no loop; use at least 1 (e.g. "
            "--loop-repeats 5)"
        )
    if baseline not in BASELINES:
        raise ConfigError(choice("--baseline", baseline, BASELINES))
    if timed_steps < 2:
        raise ConfigError(
            f"--timed-steps {timed_steps} gives no median worth the name; use at least 2 (e.g. "
            "--timed-steps 20)"
        )
    if warmup < 0:
        raise ConfigError(f"--bench-warmup {warmup} must be 0 or more (e.g. --bench-warmup 3)")


def check_baseline(cfg: TrainConfig, baseline: str) -> None:
    """What each baseline can mirror. ``plain-jax`` (benchmarks/plain_jax_gpt.py) shards over
    ``data`` and tensor modes none, 1d and 2d, with learned positions, fp32 or bf16, no ZeRO,
    offload, accumulation, pipeline or sequence split, and no remat that recomputes a matmul
    (``none`` or ``dots``): its step must do the library's work and nothing else. ``torch``
    runs on one device with AdamW and learned positions."""
    if baseline == "none":
        return
    model = _models()[cfg.model]
    if type(model).__name__ != "GPTConfig":
        raise ConfigError(
            f"--baseline {baseline} is the GPT family's model, not --model {cfg.model}'s; use a "
            "GPT model (e.g. --model gpt2-tiny) or --baseline none"
        )
    position = cfg.model_overrides.get("position", model.position)
    if position != "learned":
        raise ConfigError(
            f"--baseline {baseline} has learned positions only, not model.position={position}; "
            "drop --set model.position or use --baseline none"
        )
    if baseline == "torch":
        if cfg.optim.name != "adamw":
            raise ConfigError(
                f"--baseline torch trains with AdamW only, not --optimizer {cfg.optim.name}; "
                "use --optimizer adamw or --baseline plain-jax"
            )
        return
    par = cfg.parallel
    unmirrored = [
        (par.pipe > 1, f"pipe={par.pipe}"),
        (par.seq > 1, f"seq={par.seq}"),
        (par.tensor_mode not in ("none", "1d", "2d"), f"--tensor-mode {par.tensor_mode}"),
        (par.zero != 0, f"--zero {par.zero}"),
        (cfg.remat not in ("none", "dots"), f"--remat {cfg.remat}"),
        (cfg.offload != "none", f"--offload {cfg.offload}"),
        (grad_accum_of(cfg) != 1, "gradient accumulation"),
        (cfg.precision == "fp16", "--precision fp16 (loss scaling)"),
    ]
    for bad, what in unmirrored:
        if bad:
            raise ConfigError(
                f"--baseline plain-jax mirrors data parallelism and 1d/2d tensor parallelism "
                f"only, not {what}; e.g. --mesh data=2,tensor=4 --tensor-mode 2d, or "
                "--baseline none"
            )


# ---- performance settings (--xla-preset, --profile-dir/--profile-steps) -------------------------


def _presets() -> tuple[str, ...]:
    from colossal_jax.xla_presets import PRESETS

    return tuple(PRESETS)


def check_xla_preset(name: str) -> None:
    if name not in _presets():
        raise ConfigError(choice("--xla-preset", name, _presets()))


def check_profile(directory: str | None, steps: str | None, total_steps: int) -> None:
    """``--profile-steps A:B`` needs ``--profile-dir`` and ``1 <= A <= B <= --steps``."""
    if steps is None:
        return
    example = f"--profile-steps {min(3, total_steps)}:{min(5, total_steps)}"
    if directory is None:
        raise ConfigError(f"--profile-steps {steps} needs --profile-dir DIR (where the trace goes)")
    first, sep, last = str(steps).partition(":")
    try:
        a, b = int(first), int(last)
    except ValueError:
        a, b = 0, -1
    if not sep or not 1 <= a <= b <= total_steps:
        raise ConfigError(
            f"--profile-steps {steps} must be A:B with 1 <= A <= B <= --steps {total_steps} "
            f"(the steps traced, inclusive); e.g. {example}"
        )


# ---- initialisation from a Hugging Face directory -----------------------------------------------


def hf_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The model fields the ``config.json`` of ``--init-from-hf DIR`` sets ({} without it), once
    the directory passes :func:`check_hf_directory`."""
    if cfg.init_from_hf is None:
        return {}
    family, config = check_hf_directory(cfg.init_from_hf, cfg.model)
    try:
        return family.overrides(config)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--init-from-hf {cfg.init_from_hf}: {e}") from None


def check_hf_directory(directory: str, model: str) -> tuple[Any, dict[str, Any]]:
    """``(family module, config.json)`` of a Hugging Face directory that our model ``model``
    (``--model``) can load: a mapped ``model_type`` of ``model``'s family, every option our
    model computes alike (``SUPPORTED`` of the family), and a weight file."""
    from pathlib import Path

    from colossal_jax import hf

    flag = f"--init-from-hf {directory}"
    config = hf.read_config(directory)
    model_type = config.get("model_type")
    if model_type not in hf.FAMILIES:
        raise ConfigError(
            f"{flag} holds a {model_type!r} model (config.json model_type); the mapped families "
            f"are {', '.join(hf.FAMILIES)}"
        )
    family = hf.family(model_type)
    models = _models()
    base = models.get(model)
    if base is not None and type(base).__name__ != family.CONFIG_CLASS:
        same = [n for n, m in models.items() if type(m).__name__ == family.CONFIG_CLASS]
        raise ConfigError(
            f"{flag} holds a {model_type} model but --model {model} is a "
            f"{type(base).__name__}; use a --model of that family"
            + (f", e.g. --model {same[0]} (the sizes come from the directory)" if same else "")
        )
    for key, (allowed, default) in family.SUPPORTED.items():
        value = config.get(key, default)
        if value not in allowed:
            raise ConfigError(
                f"{flag}: config.json has {key}={value!r}, which our model does not compute; "
                f"it supports {' or '.join(repr(a) for a in allowed)}"
            )
    if not any((Path(directory) / name).is_file() for name in hf.WEIGHT_FILES):
        raise ConfigError(
            f"{flag} has config.json but no weights (none of {', '.join(hf.WEIGHT_FILES)}); "
            "save the model with save_pretrained"
        )
    return family, config


def model_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The model fields of the run: the architecture of ``--init-from-hf`` (if given) with
    ``--set model.*`` on top, which may add to it but not contradict it."""
    from_hf = hf_overrides(cfg)
    for key, value in cfg.model_overrides.items():
        if key in from_hf and from_hf[key] != value:
            raise ConfigError(
                f"--set model.{key}={value} contradicts --init-from-hf {cfg.init_from_hf}, whose "
                f"config.json gives {key}={from_hf[key]}; drop --set model.{key} (the directory "
                "sets the architecture)"
            )
    return {**from_hf, **cfg.model_overrides}


def check_init_from_hf(cfg: TrainConfig) -> None:
    """``--init-from-hf DIR``: a directory our ``--model``'s family loads, whose architecture
    ``--set model.*`` does not contradict (:func:`model_overrides`)."""
    if cfg.init_from_hf is not None:
        model_overrides(cfg)


# ---- sampling (scripts/generate.py) -------------------------------------------------------------


def check_sampling(
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    num_samples: int,
    vocab_size: int,
    prompt_vocab: int,
) -> None:
    """The sampling flags of ``scripts/generate.py`` against the model's vocabulary."""
    if prompt_tokens < 1:
        raise ConfigError("--prompt is empty; give at least one character, e.g. --prompt 'def '")
    if max_new_tokens < 1:
        raise ConfigError(
            f"--max-new-tokens {max_new_tokens} must be at least 1 (e.g. --max-new-tokens 200)"
        )
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(
            f"--temperature {temperature} must be a finite number ≥ 0 (0: greedy); e.g. "
            "--temperature 0.8"
        )
    if top_k is not None and not 1 <= top_k <= vocab_size:
        raise ConfigError(
            f"--top-k {top_k} must be between 1 and the vocabulary size {vocab_size}; e.g. "
            "--top-k 40, or omit it"
        )
    if num_samples < 1:
        raise ConfigError(f"--num-samples {num_samples} must be at least 1 (e.g. --num-samples 1)")
    if prompt_vocab > vocab_size:
        raise ConfigError(
            f"--prompt encodes to byte ids up to {prompt_vocab - 1}, beyond the model's "
            f"vocabulary of {vocab_size}; use a prompt of characters the model was trained on"
        )
