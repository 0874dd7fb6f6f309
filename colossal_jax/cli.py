"""Command line of ``scripts/train.py`` (also installed as ``colossal-train``).

JAX is imported only after the flags are parsed, so ``--devices N`` can set XLA_FLAGS to simulate
N host devices on a CPU, and only after every rule of :mod:`colossal_jax.config` has passed when
the device count is known without JAX (``--devices N``, or a ``--mesh`` that names ``data``).
Configuration errors print one line ``error: ...`` and exit with status 2; a non-finite loss
stops the run with status 3 (:mod:`colossal_jax.runtime.divergence`); SIGINT and SIGTERM stop it
after a
checkpoint with status 130 and 143 (:mod:`colossal_jax.runtime.signals`), at any moment without a
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import signal
import sys

from colossal_jax.checks import preflight
from colossal_jax.checks.validate import check_config, resolve_model
from colossal_jax.config import (
    AXES,
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
    coerce,
    describe_preset,
    field_types,
    list_presets,
    param_count,
    parse_mesh,
    suggest,
    warmup_note,
)
from colossal_jax.config.model_rules import check_with_model
from colossal_jax.config.train_rules import check_peer_timeout, check_xla_preset
from colossal_jax.runtime import signals

DEFAULT_CPU_DEVICES = 8
DEFAULT_PEER_TIMEOUT = 60.0
"""Seconds a multi-process run waits on a silent peer before exiting (``--peer-timeout``)."""
PEER_LOST_EXIT = 4
"""Exit status of a process that lost contact with a peer (:mod:`colossal_jax.runtime.watchdog`)."""


EXAMPLES = {  # a valid value for each flag whose default does not show one
    "--mesh": "data=8",
    "--devices": "8",
    "--tensor-mode": "1d",
    "--tensor-depth": "2",
    "--seq-mode": "ring",
    "--zero": "1",
    "--metrics-file": "/tmp/metrics.jsonl",
    "--peak-tflops": "989",
    "--tensorboard-dir": "/tmp/tb",
    "--checkpoint-dir": "/tmp/ckpt",
    "--set": "model.n_layer=2",
    "--coordinator": "10.0.0.1:1234",
    "--num-processes": "2",
    "--process-id": "0",
    "--peer-timeout": "120",
    "--xla-preset": "gpu-perf",
    "--profile-dir": "/tmp/profile",
    "--profile-steps": "3:5",
    "--collective-matmul": "on",
    "--init-from-hf": "/path/to/gpt2_save_pretrained_dir",
    "--steps": "200",
    "--batch-size": "16",
    "--seq-len": "128",
    "--lr": "0.003",
    "--warmup-steps": "20",
    "--data": "stdlib",
    "--eval-every": "50",
}

FAMILY_FLAGS = {  # TrainConfig field (optim.<field>) -> the argparse dest a family may default
    "steps": "steps",
    "batch_size": "batch_size",
    "seq_len": "seq_len",
    "data": "data",
    "eval_every": "eval_every",
    "optim.lr": "lr",
    "optim.warmup_steps": "warmup_steps",
}
"""Flags whose default comes from the model's family
(``colossal_jax_models.registry.train_defaults``) when
the command line does not give them; the library-wide default otherwise."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except where the help itself says where the default comes from."""

    def _get_help_string(self, action):
        if action.default is None and "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, a valid alternative
        raise ConfigError(self._explain(message))

    def _explain(self, message: str) -> str:
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        if message.startswith("unrecognized arguments: "):
            words = message.split(": ", 1)[1].split()
            unknown = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            if not unknown:
                return (
                    f"unexpected argument {words[0]!r}: values follow a flag, e.g. --steps 100 "
                    "(see --help)"
                )
            hint = suggest(unknown[0], flags, "; ") or "; see --help for the flags"
            return f"unrecognized argument {unknown[0]}{hint}"
        flag = message.split(":", 1)[0].removeprefix("argument ").split("/")[-1].strip()
        if flag in flags:
            action = next(a for a in self._actions if flag in a.option_strings)
            example = EXAMPLES.get(flag, action.default)
            if example is not None and not isinstance(example, bool | list):
                return f"{message}; e.g. {flag} {example}"
        return message


def _int(text: str) -> int:
    """argparse type: an integer, also written 1e3 or 1_000."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _on_off(text: str) -> bool:
    """argparse type: ``on`` or ``off``."""
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r} is not on or off")
    return value == "on"


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def build_parser() -> argparse.ArgumentParser:
    d, o = TrainConfig(), OptimConfig()
    p = _Parser(
        prog="train.py",
        description="Train a model of the zoo (GPT, BERT, ViT: --list-models) with data, "
        "tensor (1D/2D/2.5D/3D), sequence and pipeline parallelism.",
        epilog="exit status: 0 done; 2 configuration error; 3 a loss or gradient norm was not "
        "finite (that step is not saved; fp16: see README); 4 lost contact with a peer process "
        "(--peer-timeout); 130/143 SIGINT/SIGTERM (a checkpoint "
        "at the step reached, then exit; re-run the same command to resume)",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,  # --step is a mistake for --steps, not an abbreviation of it
    )
    a = p.add_argument
    a("--model", default=d.model, help="model name (see --list-models)")
    a(
        "--mesh",
        default=None,
        help="axis sizes like data=2,tensor_row=2 (tensor=N is factored by --tensor-mode), "
        "a preset "
        f"name ({', '.join(list_presets())}) or a TOML path; default: data=all devices",
    )
    a(
        "--devices",
        type=_int,
        default=None,
        help=f"devices to use; on a CPU, simulate this many (default {DEFAULT_CPU_DEVICES} on CPU, "
        "all on GPU)",
    )
    a("--tensor-mode", default=None, help=f"one of {', '.join(TENSOR_MODES)}")
    a("--tensor-depth", type=_int, default=None, help="depth d of 2.5d when using --mesh tensor=N")
    a("--seq-mode", default=None, help=f"one of {', '.join(SEQ_MODES)}")
    a(
        "--zero",
        type=_int,
        default=None,
        help="ZeRO stage over data: 0 off, 1 optimizer state, 2 + gradients, 3 + parameters "
        "(gathered per layer)",
    )
    a(
        "--collective-matmul",
        type=_on_off,
        default="off",
        metavar="{on,off}",
        help="run the tensor linears' all-gathers and reduce-scatters (1d: all-reduces) as "
        "ppermute rings interleaved with partial matmuls (same values and bytes; "
        "docs/performance.md); needs --tensor-mode 1d|2d|2.5d|3d",
    )
    a(
        "--pipeline",
        default=None,
        help=f"schedule on the pipe axis: one of {', '.join(PIPELINES)} (1f1b when pipe>1)",
    )
    a(
        "--microbatches",
        type=_int,
        default=None,
        help="microbatches per step through the pipeline (a microbatch is batch/M); default 2·pipe",
    )
    a(
        "--virtual-stages",
        type=_int,
        default=1,
        help="model chunks per pipeline stage (interleaved 1F1B), e.g. 2",
    )
    family = "or the model family's (--list-models)"
    a(
        "--steps",
        type=_int,
        default=None,
        help=f"total steps of the run (default {d.steps}, {family})",
    )
    a(
        "--batch-size",
        type=_int,
        default=None,
        help=f"global batch in sequences (images) (default {d.batch_size}, {family})",
    )
    a(
        "--seq-len",
        type=_int,
        default=None,
        help=f"tokens per sequence (ViT: per image) (default {d.seq_len}, {family})",
    )
    a("--optimizer", default=o.name, help=f"one of {', '.join(OPTIMIZERS)}")
    a("--lr", type=_float, default=None, help=f"peak learning rate (default {o.lr}, {family})")
    a(
        "--warmup-steps",
        type=_int,
        default=None,
        help="steps of linear warm-up from 0 to --lr; then cosine decay to the end (default "
        f"{o.warmup_steps}, {family})",
    )
    a(
        "--weight-decay",
        type=_float,
        default=o.weight_decay,
        help="decoupled weight decay of matrices (0: off)",
    )
    a("--clip-norm", type=_float, default=o.clip_norm, help="global-norm clipping (0: off)")
    a(
        "--precision",
        default=d.precision,
        help=f"one of {', '.join(PRECISIONS)} (bf16/fp16 compute, fp32 master weights; fp16 with "
        "dynamic loss scaling)",
    )
    a(
        "--remat",
        default=d.remat,
        help=f"activation checkpointing per layer: one of {', '.join(REMATS)}",
    )
    a(
        "--grad-accum",
        type=_int,
        default=d.grad_accum,
        help="split each batch into N microbatches and accumulate their gradients (same update)",
    )
    a(
        "--device-batch",
        type=_int,
        default=d.device_batch,
        help="sequences per batch shard per microbatch: accumulate batch/(shards·N) microbatches, "
        "so --batch-size stays the global batch on any mesh (e.g. when resuming elsewhere)",
    )
    a(
        "--offload",
        default=d.offload,
        help=f"one of {', '.join(OFFLOADS)}: keep optimizer state (params: and ZeRO-3 "
        "parameters) in host memory between steps",
    )
    a("--seed", type=_int, default=d.seed, help="seeds parameter init and the data order")
    a(
        "--attention",
        default=d.attention,
        help="block attention kernel: auto (cuDNN flash attention on a GPU in bf16), xla, cudnn",
    )
    a(
        "--data",
        default=None,
        help="text: stdlib (embedded), synthetic, a text file or a .npy file; images: digits, "
        f"shapes (default {d.data}, {family})",
    )
    a(
        "--eval-every",
        type=_int,
        default=None,
        help="held-out loss (ViT: and accuracy) before step 1, every N steps and at the end; "
        f"0: off (default {d.eval_every}, {family})",
    )
    a(
        "--peak-tflops",
        type=_float,
        default=None,
        help="peak dense bf16 TFLOP/s per device, for MFU on a device the built-in table lacks",
    )
    a(
        "--xla-preset",
        default=None,
        help="apply a named set of XLA flags before JAX starts (printed when applied): "
        "gpu-perf (latency-hiding scheduler, pipelined and combined collectives; "
        "colossal_jax/xla_presets.py)",
    )
    a("--profile-dir", default=None, help="write a jax.profiler trace of --profile-steps here")
    a(
        "--profile-steps",
        default=None,
        help="the steps A:B (1-based, inclusive) traced into --profile-dir; default 3:5",
    )
    a("--metrics-file", default=None, help="JSON lines, one record per step")
    a("--tensorboard-dir", default=None, help="write TensorBoard event files here")
    a(
        "--init-from-hf",
        default=None,
        metavar="DIR",
        help="initialise the parameters from a Hugging Face save_pretrained directory (GPT-2); "
        "its config.json sets the architecture (docs/huggingface.md)",
    )
    a("--checkpoint-dir", default=None, help="save here; re-run the same command to resume")
    a(
        "--checkpoint-every",
        type=_int,
        default=d.checkpoint_every,
        help="save a checkpoint every N steps (and at the end)",
    )
    a(
        "--keep-checkpoints",
        type=_int,
        default=d.keep_checkpoints,
        help="keep the K latest checkpoints (a damaged latest one is skipped for the one before)",
    )
    a(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field: model.n_layer=2, optim.b2=0.99, steps=10, parallel.zero=1",
    )
    a("--no-progress", action="store_true", help="no progress bar")
    a("--coordinator", default=None, help="multi-process: coordinator host:port")
    a(
        "--num-processes",
        type=_int,
        default=None,
        help="multi-process: how many processes (one per host), with --coordinator",
    )
    a(
        "--process-id",
        type=_int,
        default=None,
        help="multi-process: this process's index, 0..N-1 (0 hosts the coordinator)",
    )
    a(
        "--peer-timeout",
        type=_float,
        default=DEFAULT_PEER_TIMEOUT,
        help="multi-process: seconds after which a process whose peer stopped answering "
        "(missed heartbeats, or a step that does not finish) exits with status "
        f"{PEER_LOST_EXIT} and one line naming the lost process",
    )
    a(
        "--no-cluster-detect",
        action="store_true",
        help="without --coordinator, run one process even under srun, mpirun or a Kubernetes "
        f"Indexed Job (also: {preflight.NO_CLUSTER_DETECT_ENV}=1)",
    )
    a("--list-models", action="store_true", help="print the models and their sizes, then exit")
    a("--list-meshes", action="store_true", help="print the mesh presets, then exit")
    return p


def _setup_devices(args) -> bool:
    """Simulate ``--devices`` (default 8) host devices; False if XLA_FLAGS already set a count."""
    n = args.devices if args.devices is not None else DEFAULT_CPU_DEVICES
    if n < 1:
        raise ConfigError(
            f"--devices {n} must be at least 1 (e.g. --devices {DEFAULT_CPU_DEVICES})"
        )
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" in flags:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    return True


def apply_xla_preset(name: str | None) -> None:
    """``--xla-preset``: its flags into ``XLA_FLAGS`` before JAX starts, printed (stderr)."""
    if name is None:
        return
    from colossal_jax.config import xla_presets

    check_xla_preset(name)
    print(f"note: {xla_presets.apply(name)}", file=sys.stderr)


def devices_before_jax(args, devices_set: bool) -> int | None:
    """The device count the run will have, where it is known without JAX: the simulated host
    devices under ``JAX_PLATFORMS=cpu``, ``--devices N`` when :func:`_setup_devices` set it, or
    else the size of a ``--mesh`` that names every axis it uses (``data`` included); None
    otherwise. The first two count one process's devices: with ``--num-processes P`` (every
    process launched alike) the run has P times as many."""
    forced = re.search(
        r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    processes = args.num_processes or 1
    if os.environ.get("JAX_PLATFORMS") == "cpu" and forced:
        return int(forced.group(1)) * processes
    if args.devices is not None and devices_set:
        return args.devices * processes
    if args.mesh is None or not args.mesh.strip():
        return None
    sizes = parse_mesh(
        args.mesh, None, tensor_mode=args.tensor_mode or "none", tensor_depth=args.tensor_depth
    )
    return math.prod(sizes.get(a, 1) for a in AXES) if "data" in sizes else None


def check_before_jax(args, n_devices: int) -> TrainConfig:
    """Every rule of :mod:`colossal_jax.config` for the run (the model sized for ``--data``),
    except the memory floor, which needs the devices' memory."""
    from colossal_jax.config.families import task_of
    from colossal_jax.data.tasks import data_vocab

    cfg = config_from_args(args, n_devices)
    model = resolve_model(cfg, data_vocab(task_of(cfg.model), cfg.data))
    check_with_model(cfg, model)
    return cfg


def _apply_sets(cfg: TrainConfig, sets: list[str]) -> TrainConfig:
    groups = {"optim": OptimConfig, "parallel": ParallelConfig}
    model_over = dict(cfg.model_overrides)
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not KEY=VALUE (e.g. --set model.n_layer=2)")
        key, value = (s.strip() for s in item.split("=", 1))
        head, _, rest = key.partition(".")
        if head == "model" and rest:
            _check_model_name(cfg.model)
            from colossal_jax.config.families import MODELS, family_of

            model_types = field_types(family_of(cfg.model).config_class)
            if rest not in model_types:
                raise ConfigError(
                    f"--set {key}: model has no field {rest!r}; "
                    f"{suggest(rest, model_types, suffix=' ')}fields: {', '.join(model_types)}"
                )
            example = getattr(MODELS[cfg.model], rest)
            model_over[rest] = _coerce(key, value, model_types[rest], example)
        elif head in groups and rest:
            types_ = field_types(groups[head])
            if rest not in types_:
                raise ConfigError(
                    f"--set {key}: {head} has no field {rest!r}; "
                    f"{suggest(rest, types_, suffix=' ')}fields: {', '.join(types_)}"
                )
            sub = dataclasses.replace(
                getattr(cfg, head),
                **{rest: _coerce(key, value, types_[rest], getattr(getattr(cfg, head), rest))},
            )
            cfg = dataclasses.replace(cfg, **{head: sub})
        else:
            name = rest if head == "train" and rest else key
            types_ = field_types(TrainConfig)
            plain = [t for t in types_ if t not in ("optim", "parallel", "model_overrides")]
            if name not in plain:
                near = suggest(key, plain, suffix=" ")
                raise ConfigError(
                    f"--set {key}: unknown field; {near}use model.*, "
                    f"optim.*, parallel.* or one of {', '.join(plain)}"
                )
            example = getattr(cfg, name)
            cfg = dataclasses.replace(cfg, **{name: _coerce(key, value, types_[name], example)})
            preflight.check_field(name, getattr(cfg, name))
    return dataclasses.replace(cfg, model_overrides=model_over)


def _coerce(key: str, value: str, annotation, example) -> object:
    """``coerce`` whose error names the ``--set`` item and a valid one (``--set model.n_layer=abc:
    'abc' is not a valid int; e.g. --set model.n_layer=12``)."""
    try:
        return coerce(value, annotation)
    except ConfigError as e:
        hint = f"; e.g. --set {key}={example}" if example is not None else ""
        raise ConfigError(f"--set {key}={value}: {e}{hint}") from None


def _check_model_name(name: str) -> None:
    from colossal_jax.config.families import MODELS

    if name not in MODELS:
        raise ConfigError(
            f"--model {name!r} is unknown; {suggest(name, MODELS, suffix=' ')}"
            f"choose one of {', '.join(MODELS)}"
        )


def _architecture(name: str, overrides: dict) -> dict:
    return preflight.architecture(name, overrides)


def model_rows() -> list[dict]:
    """Every model of every family (registration order): name, family, paper, task, layers,
    hidden, heads and the parameters a run with the family's default data trains
    (:func:`colossal_jax.data.tasks.sized_for_default_data`), plus the config's own count where its
    vocabulary differs."""
    from colossal_jax.config.families import FAMILIES
    from colossal_jax.data.tasks import sized_for_default_data

    rows = []
    for family in FAMILIES.values():
        for name, m in family.sizes.items():
            sized = sized_for_default_data(family.task, m)
            rows.append(
                {
                    "name": name,
                    "family": family.name,
                    "paper": family.paper,
                    "task": family.task,
                    "layers": m.n_layer,
                    "hidden": m.n_embd,
                    "heads": m.n_head,
                    "params": param_count(sized),
                    "own_vocab": m.vocab_size if sized.vocab_size != m.vocab_size else None,
                    "own_params": param_count(m),
                }
            )
    return rows


def list_models() -> list[str]:
    """``--list-models``: one line per model of every family (:func:`model_rows`)."""
    from colossal_jax.data.corpus import BYTE_VOCAB

    lines = [
        f"{'model':12s} {'family':6s} {'task':20s} {'layers':>6s} {'hidden':>6s} {'heads':>5s}  "
        "parameters with the family's default data, as a run prints them (text: the "
        f"{BYTE_VOCAB}-token byte vocabulary, masked LM with its special tokens; ViT: its "
        "image size and classes)"
    ]
    for r in model_rows():
        own = (
            f" ({r['own_params'] / 1e6:.2f}M with --set model.vocab_size={r['own_vocab']})"
            if r["own_vocab"] is not None
            else ""
        )
        lines.append(
            f"{r['name']:12s} {r['family']:6s} {r['task']:20s} {r['layers']:6d} "
            f"{r['hidden']:6d} {r['heads']:5d}  {r['params'] / 1e6:.2f}M{own}"
        )
    return lines


def model_table() -> str:
    """The README's model table (markdown) from :func:`model_rows`."""
    lines = [
        "| model | family | task | layers | hidden | heads | parameters (default data) | "
        "parameters (own vocabulary) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in model_rows():
        own = (
            f"{r['own_params'] / 1e6:,.2f}M ({r['own_vocab']:,})"
            if r["own_vocab"] is not None
            else ""
        )
        lines.append(
            f"| `{r['name']}` | {r['family']} | {r['task']} | {r['layers']} | {r['hidden']} | "
            f"{r['heads']} | {r['params'] / 1e6:,.2f}M | {own} |"
        )
    return "\n".join(lines)


def list_meshes() -> list[str]:
    head = f"{'preset':14s} {'axes (data=rest: the remaining devices)':50s} {'modes':24s} about"
    return [head] + [describe_preset(name) for name in list_presets()]


def config_from_args(args, n_devices: int) -> TrainConfig:
    mesh = parse_mesh(
        args.mesh,
        n_devices,
        tensor_mode=args.tensor_mode or "none",
        tensor_depth=args.tensor_depth,
    )
    modes = {k: mesh.pop(k) for k in ("tensor_mode", "seq_mode", "zero") if k in mesh}
    if args.tensor_mode is not None:
        modes["tensor_mode"] = args.tensor_mode
    if args.seq_mode is not None:
        modes["seq_mode"] = args.seq_mode
    if args.zero is not None:
        modes["zero"] = args.zero
    if "seq_mode" not in modes and mesh.get("seq", 1) > 1:
        modes["seq_mode"] = "ring"
    if args.pipeline is not None:
        modes["pipeline"] = args.pipeline
    modes["collective_matmul"] = args.collective_matmul
    parallel = ParallelConfig(
        **mesh, **modes, microbatches=args.microbatches, virtual_stages=args.virtual_stages
    )
    _check_model_name(args.model)
    value = _with_family_defaults(args)
    optim = OptimConfig(
        name=args.optimizer,
        lr=value("lr"),
        warmup_steps=value("warmup_steps"),
        weight_decay=args.weight_decay,
        clip_norm=args.clip_norm,
    )
    cfg = TrainConfig(
        model=args.model,
        steps=value("steps"),
        batch_size=value("batch_size"),
        seq_len=value("seq_len"),
        precision=args.precision,
        remat=args.remat,
        grad_accum=args.grad_accum,
        device_batch=args.device_batch,
        offload=args.offload,
        seed=args.seed,
        attention=args.attention,
        data=value("data"),
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        metrics_file=args.metrics_file,
        tensorboard_dir=args.tensorboard_dir,
        eval_every=value("eval_every"),
        peak_tflops=args.peak_tflops,
        xla_preset=args.xla_preset,
        profile_dir=args.profile_dir,
        profile_steps=args.profile_steps or ("3:5" if args.profile_dir else None),
        init_from_hf=args.init_from_hf,
        optim=optim,
        parallel=parallel,
    )
    cfg = dataclasses.replace(cfg, **_other_family_defaults(args.model))
    cfg = _apply_sets(cfg, args.set)
    _check_model_name(cfg.model)
    check_config(cfg, n_devices=n_devices)
    return cfg


def _with_family_defaults(args):
    """``value(dest)``: the flag as given, else the model family's default, else the library's."""
    from colossal_jax.config.families import train_defaults

    family = {
        dest: train_defaults(args.model)[k]
        for k, dest in FAMILY_FLAGS.items()
        if k in train_defaults(args.model)
    }
    library = {
        **{f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)},
        **{f.name: getattr(OptimConfig(), f.name) for f in dataclasses.fields(OptimConfig)},
    }

    def value(dest: str):
        given = getattr(args, dest)
        if given is not None:
            return given
        return family.get(dest, library[dest])

    return value


def _other_family_defaults(model: str) -> dict:
    """The family's training defaults that no flag carries (e.g. ``eval_batches``)."""
    from colossal_jax.config.families import train_defaults

    return {
        k: v
        for k, v in train_defaults(model).items()
        if k not in FAMILY_FLAGS and not k.startswith("optim.")
    }


def _log_after(notes: list[str]):
    """``print``, but first the notes on stderr: train logs only once every check has passed."""
    pending = list(notes)

    def log(line: str) -> None:
        while pending:
            print(f"note: {pending.pop(0)}", file=sys.stderr)
        print(line)

    return log


def _stop_if_signalled(where: str) -> None:
    if (signum := signals.received()) is not None:
        head = "interrupted"
        if signum != signal.SIGINT:
            head += f" by {signals.name(signum)}"
        raise signals.Interrupted(signum, f"{head} {where}; nothing saved")


def _init_distributed(args, cluster: str | None) -> None:
    """``jax.distributed.initialize`` with the explicit flags, or with none where ``cluster``
    (:func:`preflight.detect_cluster`) says JAX's auto-detection fills them in; then the peer
    watchdog (:mod:`colossal_jax.runtime.watchdog`) with ``--peer-timeout``."""
    import jax

    from colossal_jax.runtime import watchdog

    # CPU collectives across processes; has no effect on GPU/TPU backends
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's heartbeat is the backstop (it aborts the process with its own message, ~0.8 of its
    # timeout after a peer's death): three times the watchdog's timeout, so that a peer lost
    # during a step is reported by the watchdog's one line
    timeout = max(1, math.ceil(3 * args.peer_timeout))
    # JAX's preemption service takes SIGTERM over in C++ (for reached_preemption_sync_point),
    # so Python's handler would never see it. The steps carry every process's stop flag instead
    # (train.stop_flags): one mechanism for SIGINT and SIGTERM, agreed at the same step by all.
    jax.config.update("jax_enable_preemption_service", False)
    if cluster is not None:
        print(f"cluster: {cluster}; jax.distributed.initialize() detects the rest", file=sys.stderr)
        jax.distributed.initialize(heartbeat_timeout_seconds=timeout)
    else:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            heartbeat_timeout_seconds=timeout,
        )
    signals.install()  # again, in case the runtime replaced a handler
    watchdog.start(args.peer_timeout, exit_code=PEER_LOST_EXIT)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, 2 configuration, 3 diverged, 130/143
    interrupted)."""
    from colossal_jax.runtime.divergence import EXIT_CODE, Diverged

    try:
        args = build_parser().parse_args(argv)
        if args.list_meshes:
            print("\n".join(list_meshes()))
            return 0
        if args.list_models:
            print("\n".join(list_models()))
            return 0
        preflight.check_args(args)
        check_peer_timeout(args.peer_timeout)
        cluster = preflight.detect_cluster(
            os.environ, coordinator=args.coordinator, opt_out=args.no_cluster_detect
        )
        devices_set = _setup_devices(args)
        apply_xla_preset(args.xla_preset)
        # in a cluster the process count comes from JAX: the checks run once it is known
        if cluster is None and (known := devices_before_jax(args, devices_set)) is not None:
            check_before_jax(args, known)
        import jax

        if args.coordinator is not None or cluster is not None:
            _init_distributed(args, cluster)
        available = jax.device_count()
        n = available
        if args.devices is not None and jax.default_backend() != "cpu":
            if args.devices > available:
                raise ConfigError(f"--devices {args.devices} but only {available} are available")
            n = args.devices
        cfg = config_from_args(args, n)
        preflight.check_resume(cfg)
        _stop_if_signalled("before training started")
        from colossal_jax.training.trainer import train

        notes = [note] if (note := warmup_note(cfg)) else []
        train(
            dataclasses.replace(cfg, devices=n),
            progress=not args.no_progress,
            log=_log_after(notes),
        )
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"error: {e.line}", file=sys.stderr)
        return EXIT_CODE
    except signals.Interrupted as e:
        print(e.line, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # a SIGINT before the handlers were installed
        print("interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The process entry point: SIGINT/SIGTERM handlers (:mod:`colossal_jax.runtime.signals`), then
    :func:`main`, then exit with its status. (``main`` alone, as tests call it, leaves the
    handlers of the calling program alone.)"""
    signals.install()
    code = main()
    # Python's finalisation resets its own signal handlers to the default action before JAX's
    # and orbax's teardown ends, so a Ctrl-C there would kill the finished process by signal;
    # the run is over and its status decided, so ignore the two signals from here on
    signals.ignore()
    sys.exit(code)


if __name__ == "__main__":
    run()
