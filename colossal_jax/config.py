"""Configuration: frozen dataclasses, parsing of mesh strings and presets, validation.

Nothing here imports JAX, so a bad command line fails in well under a second with a message that
names the bad value and a valid alternative (:class:`ConfigError`).
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
REMATS = ("none", "full", "selective", "offload")
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
        for a, n in self.axis_sizes.items():
            if not isinstance(n, int) or n < 1:
                raise ConfigError(f"mesh axis {a}={n!r} must be a positive integer")
        if self.tensor_mode not in TENSOR_MODES:
            raise ConfigError(_choice("--tensor-mode", self.tensor_mode, TENSOR_MODES))
        if self.seq_mode not in SEQ_MODES:
            raise ConfigError(_choice("--seq-mode", self.seq_mode, SEQ_MODES))
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"--zero {self.zero} is not a ZeRO stage; use 0, 1, 2 or 3")
        self._validate_pipeline()
        if n_devices is not None and self.size != n_devices:
            raise ConfigError(
                f"the mesh {self.short()} has {self.size} devices but {n_devices} are available; "
                f"make the axis sizes multiply to {n_devices} (e.g. data={n_devices})"
            )
        r, c, d = self.tensor_row, self.tensor_col, self.tensor_depth
        mode = self.tensor_mode
        if mode == "none" and self.tensor_size > 1:
            raise ConfigError(
                f"tensor axes {self.short(('tensor_row', 'tensor_col', 'tensor_depth'))} are set "
                "but --tensor-mode is none; pass --tensor-mode 1d|2d|2.5d|3d"
            )
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
        if self.seq_mode == "none" and self.seq > 1:
            raise ConfigError(
                f"seq={self.seq} but --seq-mode is none; pass --seq-mode ring|ulysses|"
                "ring-self-attention"
            )

    def _validate_pipeline(self) -> None:
        """The pipeline rules that need no model (the layer count is checked in train.py)."""
        p, name, v = self.pipe, self.pipeline, self.virtual_stages
        if name not in PIPELINES:
            raise ConfigError(_choice("--pipeline", name, PIPELINES))
        if p == 1:
            if name != "none":
                raise ConfigError(
                    f"--pipeline {name} needs a pipe axis; add pipe=N to --mesh (e.g. "
                    "--mesh pipe=2,data=4) or use --pipeline none"
                )
            if self.microbatches not in (None, 1) or v != 1:
                raise ConfigError(
                    "--microbatches/--virtual-stages apply to pipelines; add pipe=N to --mesh"
                )
            return
        if name == "none":
            raise ConfigError(
                f"pipe={p} needs a schedule; use --pipeline 1f1b (the default), gpipe or "
                "interleaved"
            )
        m = self.num_microbatches
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

    def short(self, axes: tuple[str, ...] = AXES) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in axes if getattr(self, a) != 1) or "1"


def _choice(flag: str, value: Any, valid: tuple[str, ...]) -> str:
    return f"{flag} {value!r} is not one of {', '.join(valid)}{suggest(value, valid, '; ')}"


def suggest(value: Any, valid: Any, prefix: str = "", suffix: str = "") -> str:
    """``prefix`` "did you mean 'x'?" ``suffix`` for a near miss (any case) of one of ``valid``,
    or "" when nothing is close."""
    import difflib

    lowered = {str(v).lower(): str(v) for v in valid}
    key = str(value).lower()
    close = [key] if key in lowered else difflib.get_close_matches(key, list(lowered), n=1)
    return f"{prefix}did you mean {lowered[close[0]]!r}?{suffix}" if close else ""


def _factor_tensor(total: int, mode: str, depth: int | None) -> dict[str, int]:
    """Split the shorthand ``tensor=N`` into tensor_row/col/depth for ``mode``."""
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
    raise ConfigError(_choice("--tensor-mode", mode, TENSOR_MODES))


def parse_mesh(
    spec: str | None,
    n_devices: int,
    *,
    tensor_mode: str = "none",
    tensor_depth: int | None = None,
) -> dict[str, int]:
    """Parse ``--mesh``: ``data=2,tensor_row=2``, a preset name from ``meshes/``, or a TOML path.

    Hyphenated spellings (``tensor-row``) are accepted; ``tensor=N`` is a shorthand factored by
    the tensor mode. Unnamed axes are 1, except ``data``, which takes the remaining devices.
    Returns the axis sizes, plus ``tensor_mode``/``seq_mode``/``zero`` if a preset sets them.
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
        return {"data": n_devices}
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
        sizes.update(_factor_tensor(tensor_total, tensor_mode, tensor_depth))
    if "data" not in sizes:
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


def _load_preset(path: Path, n_devices: int) -> dict[str, Any]:
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
        """Values no optimizer can use: negative decay or clipping, moments outside [0, 1)."""
        if self.warmup_steps < 0:
            raise ConfigError(
                f"--warmup-steps {self.warmup_steps} must be 0 or more (e.g. --warmup-steps 20)"
            )
        for flag, value, example, what in (
            ("--weight-decay", self.weight_decay, "0.01", "0 turns it off"),
            ("--clip-norm", self.clip_norm, "1.0", "0 turns clipping off"),
            ("--set optim.eps=", self.eps, "1e-8", "added to the denominator"),
            ("--set optim.min_lr_ratio=", self.min_lr_ratio, "0.1", "final lr / peak lr"),
        ):
            if not (math.isfinite(value) and value >= 0):
                sep = "" if flag.endswith("=") else " "
                raise ConfigError(
                    f"{flag}{sep}{value} must be a finite number ≥ 0 ({what}); e.g. "
                    f"{flag}{sep}{example}"
                )
        for key, value, example in (("b1", self.b1, 0.9), ("b2", self.b2, 0.95)):
            if not 0 <= value < 1:
                raise ConfigError(
                    f"--set optim.{key}={value} must be in [0, 1); e.g. --set optim.{key}={example}"
                )
        if not (math.isfinite(self.lars_trust) and self.lars_trust > 0):
            raise ConfigError(
                f"--set optim.lars_trust={self.lars_trust} must be positive; e.g. "
                "--set optim.lars_trust=0.001"
            )


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
      model: a name from ``models.gpt.MODELS``.
      model_overrides: ``field -> value`` applied to the named model config.
      steps: total optimizer steps (a resumed run stops where an uninterrupted one would).
      batch_size: global batch in sequences, whatever the mesh.
      seq_len: tokens per sequence.
      precision: fp32 | bf16 | fp16 (bf16/fp16 compute, fp32 master weights and optimizer
        state; fp16 with dynamic loss scaling).
      remat: activation checkpointing of each stack layer: none | full | selective | offload
        (:mod:`colossal_jax.remat`).
      grad_accum: microbatches accumulated per optimizer step (the batch is split into this
        many; the update equals the one of the whole batch).
      offload: none | optimizer | params: keep the optimizer state (``params``: and, with
        ZeRO-3, the parameters) in host memory between steps.
      seed: seeds parameter init and the data order.
      data: ``stdlib`` (embedded corpus), ``synthetic``, or a path to a text or ``.npy`` file.
      checkpoint_dir, checkpoint_every: orbax checkpoints (every N steps and at the end).
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
    """

    model: str = "gpt2-tiny"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    precision: str = "fp32"
    remat: str = "none"
    grad_accum: int = 1
    offload: str = "none"
    seed: int = 0
    data: str = "stdlib"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    metrics_file: str | None = None
    tensorboard_dir: str | None = None
    log_every: int = 1
    devices: int | None = None
    attention: str = "auto"
    eval_every: int = 50
    eval_batches: int = 4
    peak_tflops: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def validate(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"--steps {self.steps} must be at least 1 (e.g. --steps 100)")
        if self.batch_size < 1:
            raise ConfigError(
                f"--batch-size {self.batch_size} must be at least 1 (e.g. --batch-size 16)"
            )
        if self.seq_len < 2:
            raise ConfigError(f"--seq-len {self.seq_len} must be at least 2 (e.g. --seq-len 128)")
        if self.precision not in PRECISIONS:
            raise ConfigError(_choice("--precision", self.precision, PRECISIONS))
        self._validate_memory_fields()
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(_choice("--attention", self.attention, ATTENTION_IMPLS))
        ring_kernel = self.parallel.seq > 1 and self.parallel.seq_mode in (
            "ring",
            "ring-self-attention",
        )
        if self.attention == "cudnn" and ring_kernel:
            raise ConfigError(
                f"--attention cudnn cannot run inside --seq-mode {self.parallel.seq_mode} (its "
                "blocks are masked by position and combined by log-sum-exp); use --attention auto "
                "or --seq-mode ulysses"
            )
        if self.optim.name not in OPTIMIZERS:
            raise ConfigError(_choice("--optimizer", self.optim.name, OPTIMIZERS))
        if not (math.isfinite(self.optim.lr) and self.optim.lr > 0):
            raise ConfigError(f"--lr {self.optim.lr} must be positive and finite (e.g. --lr 3e-3)")
        self.optim.validate()
        if self.checkpoint_every < 1:
            raise ConfigError(
                f"--checkpoint-every {self.checkpoint_every} must be at least 1 "
                "(e.g. --checkpoint-every 50)"
            )
        self._validate_run_fields()
        if self.checkpoint_dir is not None:
            p = Path(self.checkpoint_dir)
            if p.exists() and not p.is_dir():
                raise ConfigError(
                    f"--checkpoint-dir {self.checkpoint_dir} exists and is not a directory; "
                    "name a new or existing directory"
                )
        for flag, f in (("--metrics-file", self.metrics_file),):
            if f is not None and Path(f).is_dir():
                raise ConfigError(f"{flag} {f} is a directory; name a file")

    def _validate_memory_fields(self) -> None:
        """``--remat``, ``--grad-accum``, ``--offload`` and how they combine with ZeRO and the
        pipeline."""
        if self.remat not in REMATS:
            raise ConfigError(_choice("--remat", self.remat, REMATS))
        if self.offload not in OFFLOADS:
            raise ConfigError(_choice("--offload", self.offload, OFFLOADS))
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(
                f"--grad-accum {self.grad_accum} must be at least 1 (1: no accumulation; e.g. "
                "--grad-accum 4)"
            )
        par = self.parallel
        if self.offload == "params" and par.zero != 3:
            raise ConfigError(
                f"--offload params keeps ZeRO-3's parameter shards in host memory, but --zero is "
                f"{par.zero}; add --zero 3, or use --offload optimizer"
            )
        if par.pipelined and par.zero >= 2:
            raise ConfigError(
                f"--zero {par.zero} with a pipeline (pipe={par.pipe}) is not built yet: the "
                "pipeline executor reduces gradients over data itself; use --zero 1 with a "
                "pipeline, or drop pipe from --mesh"
            )
        if par.pipelined and self.remat != "none":
            raise ConfigError(
                f"--remat {self.remat} with a pipeline (pipe={par.pipe}) is not built yet (the "
                "executor keeps each chunk's residuals until its backward); use --remat none "
                "with a pipeline, or drop pipe from --mesh"
            )

    def _validate_run_fields(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"--seed {self.seed} must be in [0, 2**63) (e.g. --seed 0)")
        if self.log_every < 1:
            raise ConfigError(
                f"--set log_every={self.log_every} must be at least 1 (e.g. --set log_every=10)"
            )
        if self.eval_every < 0:
            raise ConfigError(
                f"--eval-every {self.eval_every} must be 0 (off) or more (e.g. --eval-every 50)"
            )
        if self.eval_batches < 1:
            raise ConfigError(
                f"--set eval_batches={self.eval_batches} must be at least 1 (e.g. "
                "--set eval_batches=4)"
            )
        if self.peak_tflops is not None and not (
            math.isfinite(self.peak_tflops) and self.peak_tflops > 0
        ):
            raise ConfigError(
                f"--peak-tflops {self.peak_tflops} must be a positive number of dense bf16 "
                "TFLOP/s per device (e.g. --peak-tflops 989 for an H100)"
            )
        par = self.parallel
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


MODEL_SIZES = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")


def validate_model(model: Any, base: Any, overrides: dict[str, Any]) -> None:
    """Model dimensions no mesh can fix. ``model`` and ``base`` (the named model) are GPTConfigs;
    ``overrides`` the ``--set model.*`` values, so the message names the flag that was given."""
    for key in MODEL_SIZES:
        value = getattr(model, key)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"--set model.{key}={value} must be a positive integer; e.g. "
                f"--set model.{key}={getattr(base, key)}"
            )
    for key, least in (("eps", 0.0), ("rope_theta", 1.0)):
        value = getattr(model, key)
        if not (math.isfinite(value) and value >= least):
            raise ConfigError(
                f"--set model.{key}={value} must be a finite number ≥ {least:g}; e.g. "
                f"--set model.{key}={getattr(base, key)}"
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


def param_count(m: Any) -> int:
    """Parameters of ``models.gpt.GPT(m)`` for a GPTConfig ``m``: embeddings, layers (with biases
    and layer norms), the final norm and the untied LM head."""
    h, w, v = m.n_embd, m.mlp_ratio * m.n_embd, m.vocab_size
    layer = 4 * h * h + 4 * h + 2 * h * w + w + h + 4 * h  # attention, MLP, two layer norms
    positions = m.block_size * h if m.position == "learned" else 0
    return v * h + positions + m.n_layer * layer + 2 * h + h * v


def state_bytes(cfg: TrainConfig, m: Any) -> float:
    """A floor on the bytes of training state per device: fp32 parameters and gradients split
    over the tensor and pipeline axes, optimizer moments also over ``data`` under ZeRO-1. No
    activations, so a model this refuses cannot fit whatever the activations."""
    par, n = cfg.parallel, param_count(m)
    slots = {"adamw": 2, "lamb": 2, "lars": 1, "sgd": 1 if cfg.optim.b1 else 0}.get(
        cfg.optim.name, 2
    )
    split = par.tensor_size * par.pipe
    opt_split = split * (par.data if par.zero >= 1 else 1)
    return 4 * n * 2 / split + 4 * n * slots / opt_split


def check_memory(
    cfg: TrainConfig, m: Any, capacity: int, sharing: int, models: dict[str, Any]
) -> None:
    """Refuse a model whose training state alone exceeds the memory: ``capacity`` bytes shared by
    ``sharing`` devices (simulated CPU devices share the host's memory)."""
    need = state_bytes(cfg, m)
    if need * sharing <= capacity:
        return
    sized = {name: dataclasses.replace(b, vocab_size=m.vocab_size) for name, b in models.items()}
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
        f"--model {cfg.model} ({param_count(m) / 1e9:.2f}B parameters) needs at least "
        f"{need / 1e9:.1f} GB per device for fp32 parameters, gradients and {cfg.optim.name} "
        f"state on the mesh {cfg.parallel.short()}, but {where}; use {alternative}, more tensor "
        "parallelism, or --zero 1"
    )


def _near(x: int, candidates: list[int]) -> list[int]:
    below = [c for c in candidates if c < x]
    above = [c for c in candidates if c > x]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


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
