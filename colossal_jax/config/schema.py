"""The run's configuration: frozen dataclasses with a docstring per field.

:class:`ParallelConfig` (mesh axes and modes), :class:`OptimConfig` (optimizer and schedule) and
:class:`TrainConfig` (one run). Their ``validate`` methods run the rules that need neither a model
nor the file system (:mod:`~colossal_jax.config.parallel_rules`,
:mod:`~colossal_jax.config.train_rules`); nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from colossal_jax.config import choices, optimizers
from colossal_jax.config.choices import AXES
from colossal_jax.config.errors import ConfigError
from colossal_jax.config.families import train_defaults
from colossal_jax.config.field_types import check_field_types
from colossal_jax.config.flags import flag
from colossal_jax.config.parallel_rules import check_parallel
from colossal_jax.config.train_rules import check_optim, check_train


class RestOfDevices(int):
    """The default size of the ``data`` axis: 1 until a run is resolved for its devices
    (:meth:`ParallelConfig.sized_for`), then the devices the other axes leave, as ``--mesh``
    without ``data=`` on the command line. An ``int`` everywhere else."""


DATA_REST = RestOfDevices(1)
"""``ParallelConfig.data`` when not given."""


@dataclass(frozen=True)
class ParallelConfig:
    """How the devices are arranged and which algorithm runs on each axis.

    Attributes:
      data: data-parallel replicas (batch split); ZeRO shards optimizer state over this axis.
        Not given (:data:`DATA_REST`): the devices the other axes leave when the run is resolved.
      pipe: pipeline stages (the layer stack split into consecutive chunks over this axis).
      tensor_row, tensor_col, tensor_depth: the tensor-parallel grid. ``1d`` uses all three as
        one group; ``2d`` a q×q grid (row, col); ``2.5d`` q×q×d; ``3d`` a q×q×q cube.
      seq: sequence-parallel group (sequence split).
      tensor_mode: ``none | 1d | 2d | 2.5d | 3d``.
      seq_mode: ``none | ring | ulysses | ring-self-attention``.
      zero: ZeRO stage over ``data``: 0 (off), 1 (optimizer state sharded), 2 (+ gradients
        reduce-scattered), 3 (+ parameters stored sharded, gathered per layer).
      pipeline: ``none | gpipe | 1f1b | interleaved`` schedule on the ``pipe`` axis; ``None``
        (the default) becomes ``1f1b`` when ``pipe > 1`` and ``none`` otherwise.
      microbatches: M, microbatches per step through the pipeline (a microbatch is
        ``batch_size / M`` sequences); ``None``: ``2·pipe``.
      virtual_stages: V, model chunks per stage of the interleaved schedule.
      collective_matmul: run the tensor linears' all-gathers and reduce-scatters (1D: the
        all-reduces) as ``ppermute`` rings interleaved with partial matmuls (Wang et al. 2023;
        docs/performance.md); same values and bytes, needs a tensor mode. Off by default: on a
        simulated CPU mesh it did not measure faster (docs/performance.md).
    """

    data: int = DATA_REST
    pipe: int = 1
    tensor_row: int = 1
    tensor_col: int = 1
    tensor_depth: int = 1
    seq: int = 1
    tensor_mode: str = flag(
        "none",
        "one of {choices}",
        choices=lambda: choices.TENSOR_MODES,
        default_from="mesh",
        example="1d",
    )
    seq_mode: str = flag(
        "none",
        "one of {choices}",
        choices=lambda: choices.SEQ_MODES,
        default_from="mesh",
        example="ring",
    )
    zero: int = flag(
        0,
        "ZeRO stage over data: 0 off, 1 optimizer state, 2 + gradients, 3 + parameters "
        "(gathered per layer)",
        default_from="mesh",
        example="1",
    )
    pipeline: str | None = flag(
        None,
        "schedule on the pipe axis: one of {choices} (1f1b when pipe>1)",
        choices=lambda: choices.PIPELINES,
    )
    microbatches: int | None = flag(
        None,
        "microbatches per step through the pipeline (a microbatch is batch/M); default 2·pipe",
    )
    virtual_stages: int = flag(1, "model chunks per pipeline stage (interleaved 1F1B), e.g. 2")
    collective_matmul: bool = flag(
        False,
        "run the tensor linears' all-gathers and reduce-scatters (1d: all-reduces) as "
        "ppermute rings interleaved with partial matmuls (same values and bytes; "
        "docs/performance.md); needs --tensor-mode 1d|2d|2.5d|3d",
        example="on",
    )

    def __post_init__(self):
        check_field_types(self)
        if self.pipeline is None:
            object.__setattr__(self, "pipeline", "1f1b" if self.pipe > 1 else "none")

    def sized_for(self, n_devices: int) -> ParallelConfig:
        """This mesh on ``n_devices`` devices: a ``data`` axis not given takes the devices the
        other axes leave (a ConfigError where their product does not divide ``n_devices``)."""
        if not isinstance(self.data, RestOfDevices):
            return self
        rest = math.prod(n for a, n in self.axis_sizes.items() if a != "data")
        if not isinstance(rest, int) or n_devices % rest:
            raise ConfigError(
                f"the mesh {self.short()} uses {rest} devices per data replica, which does not "
                f"divide the {n_devices} devices; choose sizes whose product divides {n_devices}"
            )
        return dataclasses.replace(self, data=n_devices // rest)

    @property
    def axis_sizes(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in AXES}

    @property
    def size(self) -> int:
        return math.prod(self.axis_sizes.values())

    @property
    def tensor_size(self) -> int:
        return self.tensor_row * self.tensor_col * self.tensor_depth

    def describe(self) -> str:
        axes = " × ".join(f"{a}={n}" for a, n in self.axis_sizes.items())
        modes = f"tensor_mode={self.tensor_mode} seq_mode={self.seq_mode} zero={self.zero}"
        if self.collective_matmul:
            modes += " collective_matmul=on"
        if self.pipe > 1:
            modes += f" pipeline={self.pipeline} microbatches={self.num_microbatches}" + (
                f" virtual_stages={self.virtual_stages}" if self.virtual_stages > 1 else ""
            )
        return f"mesh {axes} ({self.size} devices); {modes}"

    @property
    def pipelined(self) -> bool:
        return self.pipe > 1

    @property
    def num_microbatches(self) -> int:
        """M: the configured count, or ``2·pipe`` (1 without a pipeline)."""
        if not self.pipelined:
            return 1
        return self.microbatches if self.microbatches is not None else 2 * self.pipe

    def validate(self, n_devices: int | None = None) -> None:
        """Raise :class:`ConfigError` for an impossible mesh or mode
        (:func:`~colossal_jax.config.parallel_rules.check_parallel`);
        with ``n_devices``, also a mesh of another size."""

        check_parallel(self, n_devices)

    def short(self, axes: tuple[str, ...] = AXES) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in axes if getattr(self, a) != 1) or "1"


# ---- model / optimizer / training -------------------------------------------------------------


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and schedule.

    Attributes:
      name: adamw | lamb | lars | sgd (all from optax).
      lr: peak learning rate after warm-up.
      warmup_steps: linear warm-up from 0; then cosine decay to ``min_lr_ratio·lr`` at the end.
      min_lr_ratio: final learning rate as a fraction of the peak.
      weight_decay: decoupled weight decay (not applied to biases and norm scales).
      b1, b2, eps: Adam/LAMB moments; ``b1`` is the momentum of sgd/lars.
      clip_norm: global-norm gradient clipping threshold (0 disables).
      lars_trust: LARS trust coefficient η.
      lr_schedule: ``cosine`` or ``poly``: the decay after the warm-up
        (:data:`~colossal_jax.config.optimizers.LR_SCHEDULES`).
      poly_power: the power of the ``poly`` decay (1: linear, as LAMB's BERT runs; LARS used 2).
      lr_scaling, base_batch: ``none | sqrt | linear``: ``lr`` and ``warmup_steps`` are those of
        a batch of ``base_batch``, scaled to the run's batch
        (:func:`~colossal_jax.config.optimizers.for_batch`).
      bias_correction: LAMB's Adam moments bias-corrected (the paper; off: Colossal-AI's
        ``Lamb`` default).
      trust_ratio_max: upper bound of the LAMB/LARS trust ratio (0: none, the papers).
    """

    name: str = flag(
        "adamw", "one of {choices}", name="--optimizer", choices=lambda: choices.OPTIMIZERS
    )
    lr: float = flag(3e-3, "peak learning rate", default_from="family")
    warmup_steps: int = flag(
        20,
        "steps of linear warm-up from 0 to --lr; then cosine decay to the end",
        default_from="family",
    )
    min_lr_ratio: float = 0.1
    weight_decay: float = flag(0.01, "decoupled weight decay of matrices (0: off)")
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = flag(1.0, "global-norm clipping (0: off)")
    lars_trust: float = 0.001
    lr_schedule: str = flag(
        "cosine",
        "one of {choices}: after the warm-up, cosine or polynomial (the LAMB/LARS papers') decay",
        choices=lambda: optimizers.LR_SCHEDULES,
    )
    poly_power: float = 1.0
    lr_scaling: str = flag(
        "none",
        "one of {choices}: scale --lr (and the warm-up) from --base-batch to the batch",
        choices=lambda: optimizers.LR_SCALINGS,
    )
    base_batch: int = flag(0, "the batch --lr and --warmup-steps are set for (--lr-scaling)")
    bias_correction: bool = True
    trust_ratio_max: float = 0.0

    def __post_init__(self):
        check_field_types(self)

    def validate(self) -> None:
        """Values no optimizer can use: negative decay or clipping, moments outside [0, 1)
        (:func:`~colossal_jax.config.train_rules.check_optim`)."""

        check_optim(self)


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
      model: a name from ``colossal_jax_models.registry.MODELS`` (any family: ``gpt2-tiny``,
      ``bert-tiny``,
        ``vit-tiny`` …); its family decides the data task and may carry training defaults
        (:meth:`for_model`).
      model_overrides: ``field -> value`` applied to the named model config.
      steps: total optimizer steps (a resumed run stops where an uninterrupted one would).
      batch_size: global batch in sequences, whatever the mesh.
      seq_len: tokens per sequence.
      precision: fp32 | bf16 | fp16 (bf16/fp16 compute, fp32 master weights and optimizer
        state; fp16 with dynamic loss scaling).
      remat: activation checkpointing of each stack layer: none | dots | full | selective |
        offload (:mod:`colossal_jax.parallel.remat`; ``dots``, the default, recomputes element-wise
        ops
        only).
      grad_accum: microbatches accumulated per optimizer step (the batch is split into this
        many; the update equals the one of the whole batch).
      device_batch: sequences per batch shard per microbatch; with it the accumulation count is
        derived from the mesh, ``batch_size / (batch shards · pipeline microbatches ·
        device_batch)`` (:func:`rules.grad_accum_of`), so ``batch_size`` stays the global batch
        when a checkpoint resumes on more or fewer devices. ``None``: use ``grad_accum``.
      offload: none | optimizer | params: keep the optimizer state (``params``: and, with
        ZeRO-3, the parameters) in host memory between steps.
      seed: seeds parameter init and the data order.
      data: ``stdlib`` (embedded corpus), ``synthetic``, or a path to a text or ``.npy`` file.
      checkpoint_dir, checkpoint_every: orbax checkpoints (every N steps and at the end).
      keep_checkpoints: how many of the latest checkpoints to keep (older ones are deleted); a
        damaged latest one is skipped for the one before it.
      metrics_file: JSON lines, one record per step. A resumed run keeps the records up to the
        step it resumes from and appends; a new run (nothing to resume) refuses a file that
        holds records unless ``overwrite_metrics``, so an earlier run's records are never lost
        by accident. A ``checkpoint_dir`` that exists and holds anything (an attempt killed
        before its first checkpoint) counts as the same run: its records are replaced.
      overwrite_metrics: let a new run replace a ``metrics_file`` that holds records.
      tensorboard_dir: TensorBoard event files.
      devices: use the first N devices (default: all).
      attention: ``auto | xla | cudnn | blockwise`` block attention kernel (``auto``: cuDNN
        flash attention on a GPU in bf16, the XLA reference otherwise; ``blockwise``: the
        plain-JAX flash-style kernel on any backend, which keeps no score matrix,
        :mod:`colossal_jax.sequence.blockwise`). It applies with no sequence split and to
        Ulysses; ring kernels always use their own blockwise XLA computation.
      eval_every: evaluate on the held-out split (the corpus's last 5%) before the first step,
        every N steps and at the end; 0 disables evaluation.
      eval_batches: held-out batches (of ``batch_size`` sequences) each evaluation averages.
      peak_tflops: peak dense bf16 TFLOP/s per device for MFU where the built-in table lacks the
        device (``None``: the table's figure, or MFU not reported).
      xla_preset: a named set of XLA flags (:mod:`colossal_jax.config.xla_presets`, e.g.
      ``gpu-perf``)
        applied before JAX starts; ``None``: XLA's defaults.
      profile_dir, profile_steps: write a ``jax.profiler`` trace of steps ``"A:B"`` (1-based,
        inclusive) to ``profile_dir`` (:mod:`colossal_jax.runtime.profiling`).
      host_overlap: ``auto | on | off``: whether the loop dispatches step k+1 (its batch
        built while step k ran) before reading step k's metrics. ``auto``: on where the device
        is not the host's own processor (GPU, TPU), off on a CPU backend, where the step's
        threads share the host's cores and host work beside a step slows it
        (docs/performance.md, "The training loop").
      init_from_hf: a Hugging Face ``save_pretrained`` directory whose weights initialise the
        parameters (placed straight into their shardings; :mod:`colossal_jax.hf`). Its
        ``config.json`` sets the architecture (``model_overrides`` may not contradict it) and
        must be of ``model``'s family; a checkpoint to resume from wins over it.
    """

    model: str = flag("gpt2-tiny", "model name (see --list-models)")
    model_overrides: dict[str, Any] = field(default_factory=dict)
    steps: int = flag(200, "total steps of the run", default_from="family")
    batch_size: int = flag(16, "global batch in sequences (images)", default_from="family")
    seq_len: int = flag(128, "tokens per sequence (ViT: per image)", default_from="family")
    precision: str = flag(
        "fp32",
        "one of {choices} (bf16/fp16 compute, fp32 master weights; fp16 with dynamic loss scaling)",
        choices=lambda: choices.PRECISIONS,
    )
    remat: str = flag(
        "dots",
        "activation checkpointing per layer: one of {choices}",
        choices=lambda: choices.REMATS,
    )
    grad_accum: int = flag(
        1, "split each batch into N microbatches and accumulate their gradients (same update)"
    )
    device_batch: int | None = flag(
        None,
        "sequences per batch shard per microbatch: accumulate batch/(shards·N) microbatches, "
        "so --batch-size stays the global batch on any mesh (e.g. when resuming elsewhere)",
    )
    offload: str = flag(
        "none",
        "one of {choices}: keep optimizer state (params: and ZeRO-3 parameters) in host "
        "memory between steps",
        choices=lambda: choices.OFFLOADS,
    )
    seed: int = flag(0, "seeds parameter init and the data order")
    data: str = flag(
        "stdlib",
        "text: stdlib (embedded), synthetic, a text file or a .npy file; images: digits, shapes",
        default_from="family",
    )
    checkpoint_dir: str | None = flag(
        None, "save here; re-run the same command to resume", example="/tmp/ckpt"
    )
    checkpoint_every: int = flag(50, "save a checkpoint every N steps (and at the end)")
    keep_checkpoints: int = flag(
        3, "keep the K latest checkpoints (a damaged latest one is skipped for the one before)"
    )
    metrics_file: str | None = flag(
        None,
        "JSON lines, one record per step; a resumed run appends, a new run refuses a file "
        "that holds records (see --overwrite-metrics)",
        example="/tmp/metrics.jsonl",
    )
    overwrite_metrics: bool = flag(
        False,
        "let a new run replace the records of a --metrics-file that holds some (a resumed run "
        "appends to it either way)",
        example="on",
    )
    tensorboard_dir: str | None = flag(
        None, "write TensorBoard event files here", example="/tmp/tb"
    )
    log_every: int = 1
    devices: int | None = None
    attention: str = flag(
        "auto",
        "block attention kernel: auto (cuDNN flash attention on a GPU in bf16), xla, cudnn, "
        "blockwise (flash-style in plain JAX, any backend: no score matrix kept)",
    )
    eval_every: int = flag(
        50,
        "held-out loss (ViT: and accuracy) before step 1, every N steps and at the end; 0: off",
        default_from="family",
    )
    eval_batches: int = 4
    peak_tflops: float | None = flag(
        None,
        "peak dense bf16 TFLOP/s per device, for MFU on a device the built-in table lacks",
        example="989",
    )
    xla_preset: str | None = flag(
        None,
        "apply a named set of XLA flags before JAX starts (printed when applied): gpu-perf "
        "(latency-hiding scheduler, pipelined and combined collectives; "
        "colossal_jax/xla_presets.py)",
        example="gpu-perf",
    )
    profile_dir: str | None = flag(
        None, "write a jax.profiler trace of --profile-steps here", example="/tmp/profile"
    )
    profile_steps: str | None = flag(
        None,
        "the steps A:B (1-based, inclusive) traced into --profile-dir; default 3:5",
        example="3:5",
    )
    init_from_hf: str | None = flag(
        None,
        "initialise the parameters from a Hugging Face save_pretrained directory (GPT-2); "
        "its config.json sets the architecture (docs/huggingface.md)",
        example="/path/to/gpt2_save_pretrained_dir",
        metavar="DIR",
    )
    host_overlap: str = "auto"
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        check_field_types(self)

    @classmethod
    def for_model(cls, model: str, **fields: Any) -> TrainConfig:
        """A run of ``model`` from its family's training defaults (``vit-tiny``: the digits, 17
        tokens per image, its steps, batch and learning rate; :func:`colossal_jax_models.registry.
        train_defaults`), then ``fields``; an ``optim`` given replaces the family's optimizer
        defaults whole. ``TrainConfig(model=...)`` keeps the library-wide defaults instead."""
        try:
            defaults = train_defaults(model)
        except KeyError as e:
            raise ConfigError(e.args[0]) from None
        optim = {k.removeprefix("optim."): v for k, v in defaults.items() if k.startswith("optim.")}
        plain = {k: v for k, v in defaults.items() if not k.startswith("optim.")}
        if "optim" not in fields:
            fields["optim"] = OptimConfig(**optim)
        return cls(model=model, **{**plain, **fields})

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an impossible field: every rule that needs neither a
        model nor files (:func:`~colossal_jax.config.parallel_rules.check_parallel`,
        :func:`~colossal_jax.config.train_rules.check_train`). The rules that read a model, a
        Hugging Face directory or the file system run when a run is resolved
        (:func:`colossal_jax.checks.resolve.resolve`)."""
        check_parallel(self.parallel)
        check_train(self)


def warmup_note(cfg: TrainConfig) -> str | None:
    """What ``optim.schedule`` does to a warm-up that does not fit in the run, or None."""
    w, steps = cfg.optim.warmup_steps, cfg.steps
    if w < steps:
        return None
    fit = max(steps - 1, 0)
    tenth = steps // 10
    hint = (
        f"--warmup-steps {tenth} warms up for a tenth of the run"
        if tenth
        else ("--warmup-steps 0 starts at the peak")
    )
    return (
        f"--warmup-steps {w} is not shorter than --steps {steps}; the warm-up is cut to {fit} "
        f"steps, so the learning rate reaches --lr {cfg.optim.lr} only at the last step and "
        f"never decays ({hint})"
    )


def coerce(value: str, annotation: Any) -> Any:
    """Convert a ``--set`` string to the type of a dataclass field."""
    if isinstance(annotation, str):
        annotation = {"int": int, "float": float, "str": str, "bool": bool}.get(
            annotation.split("|")[0].strip(), str
        )
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value.lower() in ("none", "null"):
            return None
        annotation = args[0]
    if annotation is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{value!r} is not a boolean (use true or false)")
    if annotation in (int, float, str):
        try:
            return (
                annotation(float(value))
                if annotation is int and "e" in value
                else annotation(value)
            )
        except ValueError:
            raise ConfigError(f"{value!r} is not a valid {annotation.__name__}") from None
    return value


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}
