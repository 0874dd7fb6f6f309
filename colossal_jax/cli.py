"""Command line of ``scripts/train.py`` (also installed as ``colossal-train``).

JAX is imported only after the flags are parsed, so ``--devices N`` can set XLA_FLAGS to simulate
N host devices on a CPU. Configuration errors print one line ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from colossal_jax.config import (
    OPTIMIZERS,
    PIPELINES,
    PRECISIONS,
    SEQ_MODES,
    TENSOR_MODES,
    ConfigError,
    OptimConfig,
    ParallelConfig,
    TrainConfig,
    coerce,
    field_types,
    list_presets,
    parse_mesh,
)

DEFAULT_CPU_DEVICES = 8


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    d, o = TrainConfig(), OptimConfig()
    p = _Parser(
        prog="train.py",
        description="Train a GPT with data, tensor (1D/2D/2.5D/3D) and sequence parallelism.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
        type=int,
        default=None,
        help=f"devices to use; on a CPU, simulate this many (default {DEFAULT_CPU_DEVICES} on CPU, "
        "all on GPU)",
    )
    a("--tensor-mode", default=None, help=f"one of {', '.join(TENSOR_MODES)}")
    a("--tensor-depth", type=int, default=None, help="depth d of 2.5d when using --mesh tensor=N")
    a("--seq-mode", default=None, help=f"one of {', '.join(SEQ_MODES)}")
    a("--zero", type=int, default=None, help="ZeRO stage: 0 or 1 (optimizer state over data)")
    a(
        "--pipeline",
        default=None,
        help=f"schedule on the pipe axis: one of {', '.join(PIPELINES)} (1f1b when pipe>1)",
    )
    a(
        "--microbatches",
        type=int,
        default=None,
        help="microbatches per step through the pipeline (a microbatch is batch/M); default 2·pipe",
    )
    a(
        "--virtual-stages",
        type=int,
        default=1,
        help="model chunks per pipeline stage (interleaved 1F1B), e.g. 2",
    )
    a("--steps", type=int, default=d.steps, help="total steps of the run")
    a("--batch-size", type=int, default=d.batch_size, help="global batch in sequences")
    a("--seq-len", type=int, default=d.seq_len, help="tokens per sequence")
    a("--optimizer", default=o.name, help=f"one of {', '.join(OPTIMIZERS)}")
    a("--lr", type=float, default=o.lr, help="peak learning rate")
    a("--warmup-steps", type=int, default=o.warmup_steps)
    a("--weight-decay", type=float, default=o.weight_decay)
    a("--clip-norm", type=float, default=o.clip_norm, help="global-norm clipping (0: off)")
    a("--precision", default=d.precision, help=f"one of {', '.join(PRECISIONS)}")
    a("--seed", type=int, default=d.seed)
    a(
        "--attention",
        default=d.attention,
        help="block attention kernel: auto (cuDNN flash attention on a GPU in bf16), xla, cudnn",
    )
    a("--data", default=d.data, help="stdlib (embedded), synthetic, a text file or a .npy file")
    a("--metrics-file", default=None, help="JSON lines, one record per step")
    a("--tensorboard-dir", default=None)
    a("--checkpoint-dir", default=None, help="save here; re-run the same command to resume")
    a("--checkpoint-every", type=int, default=d.checkpoint_every)
    a(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any field: model.n_layer=2, optim.b2=0.99, steps=10, parallel.zero=1",
    )
    a("--no-progress", action="store_true", help="no progress bar")
    a("--coordinator", default=None, help="multi-process: coordinator host:port")
    a("--num-processes", type=int, default=None)
    a("--process-id", type=int, default=None)
    a("--list-models", action="store_true")
    a("--list-meshes", action="store_true")
    return p


def _setup_devices(args) -> None:
    n = args.devices if args.devices is not None else DEFAULT_CPU_DEVICES
    if n < 1:
        raise ConfigError(f"--devices {n} must be at least 1")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def _apply_sets(cfg: TrainConfig, sets: list[str]) -> TrainConfig:
    from models.gpt import GPTConfig

    model_types = field_types(GPTConfig)
    groups = {"optim": OptimConfig, "parallel": ParallelConfig}
    model_over = dict(cfg.model_overrides)
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not KEY=VALUE (e.g. --set model.n_layer=2)")
        key, value = (s.strip() for s in item.split("=", 1))
        head, _, rest = key.partition(".")
        if head == "model" and rest:
            if rest not in model_types:
                raise ConfigError(
                    f"--set {key}: model has no field {rest!r}; fields: {', '.join(model_types)}"
                )
            model_over[rest] = coerce(value, model_types[rest])
        elif head in groups and rest:
            types_ = field_types(groups[head])
            if rest not in types_:
                raise ConfigError(
                    f"--set {key}: {head} has no field {rest!r}; fields: {', '.join(types_)}"
                )
            sub = dataclasses.replace(getattr(cfg, head), **{rest: coerce(value, types_[rest])})
            cfg = dataclasses.replace(cfg, **{head: sub})
        else:
            name = rest if head == "train" and rest else key
            types_ = field_types(TrainConfig)
            if name not in types_ or name in ("optim", "parallel", "model_overrides"):
                raise ConfigError(
                    f"--set {key}: unknown field; use model.*, optim.*, parallel.* or one of "
                    f"{', '.join(t for t in types_ if t not in ('optim', 'parallel'))}"
                )
            cfg = dataclasses.replace(cfg, **{name: coerce(value, types_[name])})
    return dataclasses.replace(cfg, model_overrides=model_over)


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
    elif mesh.get("pipe", 1) > 1:
        modes["pipeline"] = "1f1b"
    parallel = ParallelConfig(
        **mesh, **modes, microbatches=args.microbatches, virtual_stages=args.virtual_stages
    )
    optim = OptimConfig(
        name=args.optimizer,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        clip_norm=args.clip_norm,
    )
    cfg = TrainConfig(
        model=args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        precision=args.precision,
        seed=args.seed,
        attention=args.attention,
        data=args.data,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        metrics_file=args.metrics_file,
        tensorboard_dir=args.tensorboard_dir,
        optim=optim,
        parallel=parallel,
    )
    cfg = _apply_sets(cfg, args.set)
    cfg.parallel.validate(n_devices)
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.list_meshes:
            print("\n".join(list_presets()))
            return 0
        _setup_devices(args)
        import jax

        if args.coordinator is not None:
            # CPU collectives across processes; has no effect on GPU/TPU backends
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(
                coordinator_address=args.coordinator,
                num_processes=args.num_processes,
                process_id=args.process_id,
            )
        if args.list_models:
            from models.gpt import MODELS

            for name, m in MODELS.items():
                print(
                    f"{name:12s} layers={m.n_layer:3d} hidden={m.n_embd:6d} heads={m.n_head:3d}"
                    f" params≈{m.matmul_params() / 1e6:,.0f}M"
                )
            return 0
        available = jax.device_count()
        n = available
        if args.devices is not None and jax.default_backend() != "cpu":
            if args.devices > available:
                raise ConfigError(f"--devices {args.devices} but only {available} are available")
            n = args.devices
        cfg = config_from_args(args, n)
        from colossal_jax.train import train

        train(dataclasses.replace(cfg, devices=n), progress=not args.no_progress)
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
