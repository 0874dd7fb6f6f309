"""Configuration: frozen dataclasses, parsing of mesh strings and presets.

The rules that decide whether a configuration is possible live in :mod:`colossal_jax.rules`; the
``validate`` methods here call them. Nothing here imports JAX, so a bad command line fails in
well under a second with a message that names the bad value and a valid alternative
(:class:`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AXES: tuple[str, ...] = ("data", "pipe", "tensor_row", "tensor_col", "tensor_depth", "seq")
"""The six mesh axes, in the order they are printed. Device order puts tensor axes innermost."""

MESH_ORDER: tuple[str, ...] = ("data", "pipe", "seq", "tensor_depth", "tensor_row", "tensor_col")
"""Axis order of the physical mesh: data outermost (crosses hosts), tensor innermost (NVLink)."""

TENSOR_MODES = ("none", "1d", "2d", "2.5d", "3d")
ATTENTION_IMPLS = ("auto", "xla", "cudnn")
SEQ_MODES = ("none", "ring", "ulysses", "ring-self-attention")
PRECISIONS = ("fp32", "bf16", "fp16")
REMATS = ("none", "dots", "full", "selective", "offload")
OFFLOADS = ("none", "optimizer", "params")
PIPELINES = ("none", "gpipe", "1f1b", "interleaved")
OPTIMIZERS = ("adamw", "lamb", "lars", "sgd")
MESHES_DIR = Path(__file__).resolve().parent.parent / "meshes"


class ConfigError(ValueError):
    """An impossible configuration, reported before anything compiles."""


@dataclass(frozen=True)
class ParallelConfig:
    """How the devices are arranged and which algorithm runs on each axis.

    Attributes:
      data: data-parallel replicas (batch split); ZeRO shards optimizer state over this axis.
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

    data: int = 1
    pipe: int = 1
    tensor_row: int = 1
    tensor_col: int = 1
    tensor_depth: int = 1
    seq: int = 1
    tensor_mode: str = "none"
    seq_mode: str = "none"
    zero: int = 0
    pipeline: str | None = None
    microbatches: int | None = None
    virtual_stages: int = 1
    collective_matmul: bool = False

    def __post_init__(self):
        if self.pipeline is None:
            object.__setattr__(self, "pipeline", "1f1b" if self.pipe > 1 else "none")

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
        """Raise :class:`ConfigError` for an impossible mesh or mode (:func:`rules.check_parallel`);
        with ``n_devices``, also a mesh of another size."""
        from colossal_jax import rules

        rules.check_parallel(self, n_devices)

    def short(self, axes: tuple[str, ...] = AXES) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in axes if getattr(self, a) != 1) or "1"


def suggest(value: Any, valid: Any, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` "did you mean 'x'?" ``suffix`` for a near miss (any case) of one of ``valid``,
    or "" when nothing is close."""
    import difflib

    lowered = {str(v).lower(): str(v) for v in valid}
    key = str(value).lower()
    close = [key] if key in lowered else difflib.get_close_matches(key, list(lowered), n=1)
    return f"{prefix}did you mean {lowered[close[0]]!r}?{suffix}" if close else ""


def parse_mesh(
    spec: str | None,
    n_devices: int | None,
    *,
    tensor_mode: str = "none",
    tensor_depth: int | None = None,
) -> dict[str, int]:
    """Parse ``--mesh``: ``data=2,tensor_row=2``, a preset name from ``meshes/``, or a TOML path.

    Hyphenated spellings (``tensor-row``) are accepted; ``tensor=N`` is a shorthand factored by
    the tensor mode. Unnamed axes are 1, except ``data``, which takes the remaining devices.
    Returns the axis sizes, plus ``tensor_mode``/``seq_mode``/``zero`` if a preset sets them.
    With ``n_devices=None`` (not known yet) an unnamed ``data`` is left out of the result.
    """
    if tensor_depth is not None and tensor_depth < 1:
        raise ConfigError(
            f"--tensor-depth {tensor_depth} must be at least 1 (e.g. --tensor-depth 2)"
        )
    if spec is not None and spec.strip() == "":
        raise ConfigError(
            f"--mesh {spec!r} is empty; omit --mesh or give e.g. data={n_devices} (without "
            f"--mesh, data parallelism over all {n_devices} devices)"
        )
    preset = _preset_path(spec) if spec is not None else None
    if preset is not None:
        if tensor_depth is not None:
            raise ConfigError(
                f"--tensor-depth {tensor_depth} does not apply to the preset {spec} (it sets its "
                "own axes); omit --tensor-depth"
            )
        return _load_preset(preset, n_devices)
    if tensor_depth is not None and (tensor_mode != "2.5d" or spec is None):
        raise ConfigError(_depth_alone(tensor_depth, spec, tensor_mode))
    if spec is None:
        return {"data": n_devices} if n_devices is not None else {}
    sizes: dict[str, int] = {}
    tensor_total: int | None = None
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ConfigError(
                f"--mesh entry {part!r} is not axis=size (e.g. data=2,tensor_row=4), nor a preset "
                f"in {MESHES_DIR} ({', '.join(list_presets()) or 'none'})"
            )
        name, value = (s.strip() for s in part.split("=", 1))
        name = name.replace("-", "_")
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"--mesh {name}={value!r}: the size must be an integer") from None
        if n < 1:
            raise ConfigError(f"--mesh {name}={n}: sizes must be at least 1")
        if name == "tensor":
            if tensor_total is not None:
                raise ConfigError(
                    f"--mesh names tensor twice (tensor={tensor_total} and tensor={n}); give it "
                    f"once, e.g. tensor={tensor_total}"
                )
            tensor_total = n
            continue
        if name not in AXES:
            import difflib

            close = difflib.get_close_matches(name, AXES + ("tensor",), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"--mesh axis {name!r} is unknown; {hint}valid axes: {', '.join(AXES)} (or tensor)"
            )
        if name in sizes:
            raise ConfigError(
                f"--mesh names axis {name!r} twice ({name}={sizes[name]} and {name}={n}); give "
                f"each axis once, e.g. {name}={sizes[name]}"
            )
        sizes[name] = n
    if tensor_depth is not None and tensor_total is None:
        raise ConfigError(_depth_alone(tensor_depth, spec, tensor_mode))
    if tensor_total is not None:
        given = [a for a in ("tensor_row", "tensor_col", "tensor_depth") if a in sizes]
        if given:
            raise ConfigError(f"--mesh gives both tensor= and {given[0]}=; use one or the other")
        from colossal_jax.rules import factor_tensor

        sizes.update(factor_tensor(tensor_total, tensor_mode, tensor_depth))
    if "data" not in sizes and n_devices is not None:
        rest = math.prod(sizes.values())
        if n_devices % rest:
            raise ConfigError(
                f"--mesh {spec} uses {rest} devices per data replica, which does not divide the "
                f"{n_devices} devices; choose sizes whose product divides {n_devices}"
            )
        sizes["data"] = n_devices // rest
    return sizes


def _depth_alone(depth: int, spec: str | None, mode: str) -> str:
    return (
        f"--tensor-depth {depth} applies only to --mesh tensor=N with --tensor-mode 2.5d (got "
        f"--mesh {spec or '(none)'}, --tensor-mode {mode}); e.g. --mesh tensor=8 --tensor-mode "
        "2.5d --tensor-depth 2, or omit --tensor-depth"
    )


def list_presets() -> list[str]:
    return sorted(p.stem for p in MESHES_DIR.glob("*.toml"))


def _preset_path(spec: str) -> Path | None:
    if spec.endswith(".toml"):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"--mesh {spec}: no such TOML file")
        return path
    if "=" not in spec and "," not in spec:
        path = MESHES_DIR / f"{spec}.toml"
        if path.is_file():
            return path
        raise ConfigError(
            f"--mesh {spec!r} is neither axis=size pairs nor a preset; presets: "
            f"{', '.join(list_presets())}"
        )
    return None


def _load_preset(path: Path, n_devices: int | None) -> dict[str, Any]:
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--mesh {path}: not valid TOML ({e})") from None
    mesh = doc.get("mesh", {})
    spec = ",".join(f"{k}={v}" for k, v in mesh.items())
    modes = doc.get("modes", {})
    out: dict[str, Any] = parse_mesh(
        spec or None,
        n_devices,
        tensor_mode=modes.get("tensor_mode", "none"),
        tensor_depth=modes.get("tensor_depth"),
    )
    for key in ("tensor_mode", "seq_mode", "zero"):
        if key in modes:
            out[key] = modes[key]
    return out


def describe_preset(name: str) -> str:
    """One line for ``--list-meshes``: name, axis sizes, modes, and the preset's own comment."""
    path = MESHES_DIR / f"{name}.toml"
    text = path.read_text()
    doc = tomllib.loads(text)
    mesh = doc.get("mesh", {})
    axes = " ".join(["data=rest"] * ("data" not in mesh) + [f"{k}={v}" for k, v in mesh.items()])
    modes = " ".join(f"{k}={v}" for k, v in doc.get("modes", {}).items()) or "-"
    note = " ".join(
        line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")
    ).strip()
    return f"{name:14s} {axes:50s} {modes:24s} {note}".rstrip()


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
    """

    name: str = "adamw"
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    lars_trust: float = 0.001

    def validate(self) -> None:
        """Values no optimizer can use: negative decay or clipping, moments outside [0, 1)
        (:func:`rules.check_optim`)."""
        from colossal_jax import rules

        rules.check_optim(self)


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
      model: a name from ``models.registry.MODELS`` (any family: ``gpt2-tiny``, ``bert-tiny``,
        ``vit-tiny`` …); its family decides the data task and may carry training defaults
        (:meth:`for_model`).
      model_overrides: ``field -> value`` applied to the named model config.
      steps: total optimizer steps (a resumed run stops where an uninterrupted one would).
      batch_size: global batch in sequences, whatever the mesh.
      seq_len: tokens per sequence.
      precision: fp32 | bf16 | fp16 (bf16/fp16 compute, fp32 master weights and optimizer
        state; fp16 with dynamic loss scaling).
      remat: activation checkpointing of each stack layer: none | dots | full | selective |
        offload (:mod:`colossal_jax.remat`; ``dots``, the default, recomputes element-wise ops
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
      metrics_file: JSON lines, one record per step. tensorboard_dir: TensorBoard event files.
      devices: use the first N devices (default: all).
      attention: ``auto | xla | cudnn`` block attention kernel (``auto``: cuDNN flash attention
        on a GPU in bf16, the XLA reference otherwise). It applies with no sequence split and to
        Ulysses; ring kernels always use their own blockwise XLA computation.
      eval_every: evaluate on the held-out split (the corpus's last 5%) before the first step,
        every N steps and at the end; 0 disables evaluation.
      eval_batches: held-out batches (of ``batch_size`` sequences) each evaluation averages.
      peak_tflops: peak dense bf16 TFLOP/s per device for MFU where the built-in table lacks the
        device (``None``: the table's figure, or MFU not reported).
      xla_preset: a named set of XLA flags (:mod:`colossal_jax.xla_presets`, e.g. ``gpu-perf``)
        applied before JAX starts; ``None``: XLA's defaults.
      profile_dir, profile_steps: write a ``jax.profiler`` trace of steps ``"A:B"`` (1-based,
        inclusive) to ``profile_dir`` (:mod:`colossal_jax.profiling`).
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

    model: str = "gpt2-tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    precision: str = "fp32"
    remat: str = "dots"
    grad_accum: int = 1
    device_batch: int | None = None
    offload: str = "none"
    seed: int = 0
    data: str = "stdlib"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    metrics_file: str | None = None
    tensorboard_dir: str | None = None
    log_every: int = 1
    devices: int | None = None
    attention: str = "auto"
    eval_every: int = 50
    eval_batches: int = 4
    peak_tflops: float | None = None
    xla_preset: str | None = None
    profile_dir: str | None = None
    profile_steps: str | None = None
    init_from_hf: str | None = None
    host_overlap: str = "auto"
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @classmethod
    def for_model(cls, model: str, **fields: Any) -> TrainConfig:
        """A run of ``model`` from its family's training defaults (``vit-tiny``: the digits, 17
        tokens per image, its steps, batch and learning rate; :func:`models.registry.
        train_defaults`), then ``fields``; an ``optim`` given replaces the family's optimizer
        defaults whole. ``TrainConfig(model=...)`` keeps the library-wide defaults instead."""
        from models.registry import train_defaults

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
        """Raise :class:`ConfigError` for an impossible field (:func:`rules.check_config`
        without a model) or an unusable output path (:mod:`colossal_jax.preflight`)."""
        from colossal_jax import preflight, rules

        rules.check_config(self)
        for name in ("checkpoint_dir", "metrics_file", "profile_dir"):
            preflight.check_field(name, getattr(self, name))


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


def param_count(m: Any) -> int:
    """Parameters of the module a model config ``m`` (any family's,
    :class:`models.registry.ModelConfig`) builds: its own count."""
    return m.param_count()


def state_bytes(cfg: TrainConfig, m: Any) -> float:
    """A floor on the bytes of training state per device in device memory: fp32 parameters,
    gradients and optimizer moments split over the tensor and pipeline axes, and over ``data``
    by the ZeRO stage (moments from 1, gradients from 2, parameters at 3); host-offloaded state
    does not count. No activations, so a model this refuses cannot fit whatever the
    activations."""
    par, n = cfg.parallel, param_count(m)
    slots = {"adamw": 2, "lamb": 2, "lars": 1, "sgd": 1 if cfg.optim.b1 else 0}.get(
        cfg.optim.name, 2
    )
    split = par.tensor_size * par.pipe

    def over_data(from_stage: int) -> int:
        return split * (par.data if par.zero >= from_stage else 1)

    params = 0.0 if cfg.offload == "params" else 4 * n / over_data(3)
    opt = 0.0 if cfg.offload in ("optimizer", "params") else 4 * n * slots / over_data(1)
    return params + 4 * n / over_data(2) + opt


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
