"""The training run: state created in its shardings, the jitted step, the loop.

Data flow: ``TrainConfig`` (validated) → mesh → layout → model built abstractly → shardings
from parameter roles (+ ZeRO-1 over ``data`` for the optimizer state) → parameters and optimizer
state initialised directly in their shardings → restore the latest checkpoint → per-step global
batches assembled from per-process data → jitted step → metrics → async checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.checkpoint import Checkpointer, abstract_like
from colossal_jax.config import ConfigError, TrainConfig
from colossal_jax.data import Batches, load_corpus
from colossal_jax.layers import use_parallelism
from colossal_jax.mesh import build_mesh
from colossal_jax.metrics import MetricsWriter, device_memory, peak_flops
from colossal_jax.optim import make_optimizer, schedule
from colossal_jax.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.tensor.layout import LocalAttention, TensorLayout
from models.gpt import GPT, GPTConfig, model_config


def resolve_model(cfg: TrainConfig, data_vocab: int | None) -> GPTConfig:
    """The model config: the named one, the data's vocabulary, then ``--set model.*``."""
    overrides = dict(cfg.model_overrides)
    if data_vocab is not None and "vocab_size" not in overrides:
        overrides["vocab_size"] = data_vocab
    try:
        model = model_config(cfg.model, **overrides)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--set model.*: {e}") from None
    return model


def validate_run(cfg: TrainConfig, model: GPTConfig, layout: TensorLayout) -> None:
    """Every divisibility the chosen mesh and modes need, checked before anything compiles."""
    import os

    from colossal_jax.config import check_memory, validate_model
    from models.gpt import MODELS

    validate_model(model, MODELS[cfg.model], cfg.model_overrides)
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        check_memory(cfg, model, int(stats["bytes_limit"]), 1, MODELS)
    elif device.platform == "cpu" and hasattr(os, "sysconf"):
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        check_memory(cfg, model, host, min(cfg.parallel.size, jax.local_device_count()), MODELS)
    par = cfg.parallel
    if cfg.seq_len > model.block_size:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds the model's block_size {model.block_size}; use "
            f"--seq-len {model.block_size} or --set model.block_size={cfg.seq_len}"
        )
    split = layout.batch_divisor()
    if cfg.batch_size % split:
        good = split * max(1, round(cfg.batch_size / split))
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is not divisible by the {split} batch shards of the "
            f"mesh ({par.short()}, tensor_mode={par.tensor_mode}); use --batch-size {good}"
        )
    seq_split = par.seq * (2 if par.seq_mode == "ring" and par.seq > 1 else 1)
    if cfg.seq_len % seq_split:
        why = "2·seq zigzag chunks" if seq_split != par.seq else "seq"
        raise ConfigError(
            f"--seq-len {cfg.seq_len} is not divisible by {seq_split} ({why}); use "
            f"--seq-len {seq_split * max(1, cfg.seq_len // seq_split)}"
        )
    if par.pipelined:
        m = par.num_microbatches
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
                "fewer --microbatches"
            )
    if par.seq_mode == "ulysses" and par.seq > 1:
        head_split = layout.axis_size(layout.wide_spec()[2])
        local_heads = model.n_head // max(head_split, 1)
        if local_heads % par.seq:
            raise ConfigError(
                f"ulysses needs the heads per tensor shard ({local_heads}) divisible by seq="
                f"{par.seq}; use --seq-mode ring or n_head divisible by {par.seq * head_split}"
            )
    try:
        from colossal_jax.sequence.fused import resolve

        resolve(cfg.attention, jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32)
        layout.validate(
            hidden=model.n_embd, mlp=model.mlp_width, heads=model.n_head, vocab=model.vocab_size
        )
        if model.position == "learned" and model.block_size % max(1, _embedding_split(layout)):
            raise ValueError(
                f"block_size {model.block_size} is not divisible by the embedding split "
                f"{_embedding_split(layout)}"
            )
    except ValueError as e:
        raise ConfigError(f"{e} (model {cfg.model}, tensor_mode={par.tensor_mode})") from None


def _embedding_split(layout: TensorLayout) -> int:
    first = layout.embedding_spec()[0] if len(layout.embedding_spec()) else None
    return layout.axis_size(first)


@dataclass
class Run:
    """Everything built for a run, before any step executes."""

    cfg: TrainConfig
    model: GPTConfig
    mesh: jax.sharding.Mesh
    layout: TensorLayout
    local_attention: LocalAttention
    graphdef: Any
    abstract_params: Any
    param_shardings: Any
    opt_shardings: Any
    batch_sharding: NamedSharding
    tx: optax.GradientTransformation
    batches: Batches
    schedule: Any = None


def build(cfg: TrainConfig) -> Run:
    """Validate ``cfg`` against the devices and the model, and derive every sharding."""
    cfg.validate()
    corpus = load_corpus(cfg.data)
    model = resolve_model(cfg, corpus.vocab_size)
    devices = jax.devices()
    if cfg.devices is not None:
        if cfg.devices > len(devices):
            raise ConfigError(f"--devices {cfg.devices} but only {len(devices)} are available")
        devices = devices[: cfg.devices]
    mesh = build_mesh(cfg.parallel, devices)
    layout = make_layout(cfg.parallel, mesh)
    validate_run(cfg, model, layout)
    local_attention = make_local_attention(cfg.parallel, implementation=cfg.attention)

    abstract_model = nnx.eval_shape(lambda: GPT(model, rngs=nnx.Rngs(cfg.seed)))
    graphdef, abstract_params = nnx.split(abstract_model)
    layer_entry = "pipe" if cfg.parallel.pipelined else None
    param_shardings = tree_shardings(abstract_params, layout, layer_entry=layer_entry)
    tx = make_optimizer(cfg.optim, cfg.steps)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    zero_axis = "data" if cfg.parallel.zero >= 1 else None
    opt_shardings = tree_shardings(
        abstract_opt, layout, zero_axis=zero_axis, layer_entry=layer_entry
    )
    schedule = None
    if cfg.parallel.pipelined:
        from colossal_jax.pipeline.schedule import build as build_schedule

        par = cfg.parallel
        schedule = build_schedule(par.pipeline, par.pipe, par.num_microbatches, par.virtual_stages)

    order = None
    if cfg.parallel.seq_mode == "ring" and cfg.parallel.seq > 1:
        from colossal_jax.sequence.zigzag import zigzag_permutation

        order = zigzag_permutation(cfg.seq_len, cfg.parallel.seq)
    batches = Batches(corpus, cfg.batch_size, cfg.seq_len, cfg.seed, model.vocab_size, order)
    return Run(
        cfg=cfg,
        model=model,
        mesh=mesh,
        layout=layout,
        local_attention=local_attention,
        graphdef=graphdef,
        abstract_params=abstract_params,
        param_shardings=param_shardings,
        opt_shardings=opt_shardings,
        batch_sharding=NamedSharding(mesh, layout.token_spec()),
        tx=tx,
        batches=batches,
        schedule=schedule,
    )


def init_state(run: Run) -> tuple[Any, Any]:
    """Parameters and optimizer state, created directly in their shardings."""
    model_cfg, seed = run.model, run.cfg.seed

    def init():
        params = nnx.state(GPT(model_cfg, rngs=nnx.Rngs(seed)))
        return params, run.tx.init(params)

    init = jax.jit(init, out_shardings=(run.param_shardings, run.opt_shardings))
    return init()


def make_train_step(run: Run) -> Callable:
    """The jitted step ``(params, opt_state, batch) -> (params, opt_state, metrics)``."""
    compute_dtype = jnp.bfloat16 if run.cfg.precision == "bf16" else jnp.float32

    def loss_fn(params, batch):
        if compute_dtype != jnp.float32:
            params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
        with use_parallelism(run.layout, run.local_attention):
            model = nnx.merge(run.graphdef, params)
            return model.loss(
                batch["tokens"], batch["positions"], batch["targets"], batch["weights"]
            )

    value_and_grad = jax.value_and_grad(loss_fn)
    if run.schedule is not None:
        from colossal_jax.pipeline.step import pipelined_value_and_grad

        value_and_grad = pipelined_value_and_grad(
            run.graphdef,
            run.schedule,
            run.layout,
            run.local_attention,
            n_layer=run.model.n_layer,
            compute_dtype=compute_dtype,
        )

    def step(params, opt_state, batch):
        loss, grads = value_and_grad(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = run.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": grad_norm}

    batch_shardings = {k: run.batch_sharding for k in ("tokens", "targets", "positions", "weights")}
    return jax.jit(
        step,
        in_shardings=(run.param_shardings, run.opt_shardings, batch_shardings),
        out_shardings=(run.param_shardings, run.opt_shardings, None),
        donate_argnums=(0, 1),
    )


def global_batch(run: Run, step: int) -> dict[str, jax.Array]:
    """The batch of ``step`` as global arrays; each process builds only its addressable shards."""
    host = run.batches.batch(step)
    return {
        k: jax.make_array_from_callback(v.shape, run.batch_sharding, lambda idx, v=v: v[idx])
        for k, v in host.items()
    }


def per_device_bytes(tree: Any) -> int:
    """Bytes of ``tree`` held by the most loaded device (from the arrays' shardings)."""
    counts: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            counts[shard.device] = counts.get(shard.device, 0) + shard.data.nbytes
    return max(counts.values()) if counts else 0


@dataclass
class Summary:
    steps_run: int
    start_step: int
    final_step: int
    losses: list[float]
    first_loss: float | None
    final_loss: float | None
    tokens_per_s: float | None
    mfu: float | None
    compile_s: float
    wall_s: float


def train(
    cfg: TrainConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Summary:
    """Run (or resume) ``cfg`` to ``cfg.steps``; returns the per-step losses of this process."""
    t_start = time.perf_counter()
    run = build(cfg)
    is_main = jax.process_index() == 0
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(run.abstract_params))
    if is_main:
        log(f"{cfg.parallel.describe()}")
        log(
            f"model {cfg.model}: {n_params / 1e6:.2f}M parameters, layers={run.model.n_layer} "
            f"hidden={run.model.n_embd} heads={run.model.n_head} vocab={run.model.vocab_size}; "
            f"data {run.batches.corpus.name}; batch {cfg.batch_size}×{cfg.seq_len} tokens; "
            f"{cfg.optim.name} lr={cfg.optim.lr} precision={cfg.precision}"
        )

    ckpt = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every) if cfg.checkpoint_dir else None
    params, opt_state = init_state(run)
    start_step = 0
    if ckpt is not None and (latest := ckpt.latest_step()) is not None:
        target = {
            "params": abstract_like(params, run.param_shardings),
            "opt_state": abstract_like(opt_state, run.opt_shardings),
        }
        del params, opt_state
        state, meta = ckpt.restore(latest, target)
        params, opt_state = state["params"], state["opt_state"]
        start_step = int(meta["step"])
        if int(meta.get("seed", cfg.seed)) != cfg.seed:
            raise ConfigError(
                f"--seed {cfg.seed} differs from the checkpoint's seed {meta['seed']} in "
                f"{cfg.checkpoint_dir}; use --seed {meta['seed']} or another --checkpoint-dir"
            )
        if is_main:
            log(f"resumed from {ckpt.directory} at step {start_step}")

    step_fn = make_train_step(run)
    t0 = time.perf_counter()
    compiled = step_fn.lower(params, opt_state, global_batch(run, start_step)).compile()
    compile_s = time.perf_counter() - t0
    if is_main:
        log(f"compiled the train step in {compile_s:.1f}s")

    lr_at = schedule(cfg.optim, cfg.steps)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    flops_per_step = run.model.flops_per_token(cfg.seq_len) * tokens_per_step
    peak = peak_flops()
    n_dev = run.mesh.size
    writer = MetricsWriter(cfg.metrics_file, cfg.tensorboard_dir, resume_step=start_step)

    bar = None
    if progress and is_main:
        from tqdm import tqdm

        bar = tqdm(
            total=cfg.steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True
        )
    losses: list[float] = []
    timed_tokens, timed_seconds = 0, 0.0
    step = start_step
    try:
        while step < cfg.steps:
            batch = global_batch(run, step)
            t0 = time.perf_counter()
            params, opt_state, out = compiled(params, opt_state, batch)
            loss = float(out["loss"])
            dt = time.perf_counter() - t0
            step += 1
            losses.append(loss)
            timed_tokens += tokens_per_step
            timed_seconds += dt
            tps = tokens_per_step / dt
            mfu = flops_per_step / dt / (peak * n_dev) if peak else None
            record = {
                "step": step,
                "loss": loss,
                "lr": float(lr_at(step - 1)),
                "grad_norm": float(out["grad_norm"]),
                "step_time_s": dt,
                "tokens_per_s": tps,
                "mfu": mfu,
            }
            if (mem := device_memory()) is not None:
                record["peak_bytes_in_use"] = mem["peak_bytes_in_use"]
            if step % cfg.log_every == 0 or step == cfg.steps:
                writer.write(record)
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
                bar.update(1)
            if ckpt is not None:
                ckpt.save(
                    step,
                    {"params": params, "opt_state": opt_state},
                    _meta(cfg, step),
                    force=step == cfg.steps,
                )
    finally:
        if bar is not None:
            bar.close()
        writer.close()
        if ckpt is not None:
            ckpt.close()

    tokens_per_s = timed_tokens / timed_seconds if timed_seconds else None
    mfu = (
        flops_per_step * len(losses) / timed_seconds / (peak * n_dev)
        if peak and timed_seconds
        else None
    )
    summary = Summary(
        steps_run=len(losses),
        start_step=start_step,
        final_step=step,
        losses=losses,
        first_loss=losses[0] if losses else None,
        final_loss=losses[-1] if losses else None,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        compile_s=compile_s,
        wall_s=time.perf_counter() - t_start,
    )
    if is_main:
        log(_summary_line(summary, ckpt))
    return summary


def _meta(cfg: TrainConfig, step: int) -> dict:
    return {
        "step": step,
        "data_position": step,  # batches are a pure function of (seed, step)
        "seed": cfg.seed,
        "model": cfg.model,
        "mesh": cfg.parallel.short(),
        "config": _jsonable(dataclasses.asdict(cfg)),
    }


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _summary_line(s: Summary, ckpt: Checkpointer | None) -> str:
    if not s.losses:
        return f"nothing to do: already at step {s.final_step}"
    parts = [
        f"done: steps {s.start_step}->{s.final_step}",
        f"loss {s.first_loss:.4f} -> {s.final_loss:.4f}",
        f"{s.tokens_per_s:,.0f} tokens/s" if s.tokens_per_s else "",
        f"MFU {100 * s.mfu:.1f}%" if s.mfu is not None else "MFU n/a (unknown device peak)",
        f"compile {s.compile_s:.1f}s",
        f"wall {s.wall_s:.1f}s",
    ]
    if ckpt is not None:
        parts.append(f"checkpoints in {ckpt.directory}")
    return "; ".join(p for p in parts if p)
