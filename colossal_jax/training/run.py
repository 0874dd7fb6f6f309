"""A run built before any step executes: the config checked, the model resolved, the mesh, every
sharding, the optimizer and the data, and the state created (or restored) in those shardings.

Data flow: ``TrainConfig`` (validated) → mesh → layout → model built abstractly → shardings
from parameter roles (+ ZeRO over ``data``) → parameters and optimizer state initialised
directly in their shardings, or restored from the latest checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding

from colossal_jax.checks.validate import resolve_model
from colossal_jax.config import ConfigError, TrainConfig, xla_presets
from colossal_jax.config.families import Family, ModelConfig, family_of
from colossal_jax.config.model_rules import check_with_model, grad_accum_of
from colossal_jax.config.parallel_rules import uses_zigzag
from colossal_jax.data.tasks import TaskBatches, load_text, make_batches
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.parallel.step import stack_layer_dims
from colossal_jax.parallel.zero import leftovers, zero_dims
from colossal_jax.runtime.devices import devices_hint
from colossal_jax.tensor.layout import LocalAttention, TensorLayout
from colossal_jax.training.checkpoint import Checkpointer, abstract_like
from colossal_jax.training.optim import make_optimizer

HOST = "pinned_host"
"""The memory kind of offloaded state (``--offload``)."""


@dataclass
class Run:
    """Everything built for a run, before any step executes: ``model`` is the resolved config
    of ``family`` (:mod:`colossal_jax.config.families`), ``batches``/``eval_batches`` its task's
    data (:mod:`colossal_jax.data.tasks`), ``data_note`` a line about the data to print, or None.
    ``param_shardings``/``opt_shardings`` are where the state lives between steps (the host's
    memory with ``--offload``), ``device_*_shardings`` where the step computes on it."""

    cfg: TrainConfig
    model: ModelConfig
    mesh: jax.sharding.Mesh
    layout: TensorLayout
    local_attention: LocalAttention
    graphdef: Any
    abstract_params: Any
    param_shardings: Any
    opt_shardings: Any
    batch_sharding: NamedSharding
    tx: optax.GradientTransformation
    batches: TaskBatches
    schedule: Any = None
    eval_batches: TaskBatches | None = None
    grad_shardings: Any = None
    zero_dims: Any = None
    layer_dims: list | None = None
    device_param_shardings: Any = None
    device_opt_shardings: Any = None
    family: Family | None = None
    data_note: str | None = None

    @property
    def task(self) -> str:
        return family_of(self.cfg.model).task


def build(cfg: TrainConfig) -> Run:
    """Validate ``cfg`` against the devices and the model, and derive every sharding."""
    family, corpus, model, devices = _resolve(cfg)
    mesh = build_mesh(cfg.parallel, devices)
    layout = make_layout(cfg.parallel, mesh)
    validate_run(cfg, model, layout)
    local_attention = make_local_attention(cfg.parallel, implementation=cfg.attention)

    abstract_model = nnx.eval_shape(lambda: family.build(model, rngs=nnx.Rngs(cfg.seed)))
    graphdef, abstract_params = nnx.split(abstract_model)
    tx = make_optimizer(cfg.optim, cfg.steps)
    if cfg.precision == "fp16":
        from colossal_jax.training.loss_scale import with_dynamic_scale

        tx = with_dynamic_scale(tx)
    shardings = _state_shardings(cfg, layout, abstract_params, tx)
    order = None
    if uses_zigzag(cfg.parallel, model):
        from colossal_jax.sequence.zigzag import zigzag_permutation

        order = zigzag_permutation(cfg.seq_len, cfg.parallel.seq)
    batches, eval_batches, data_note = make_batches(cfg, family.task, model, corpus, order)
    return Run(
        cfg=cfg,
        model=model,
        mesh=mesh,
        layout=layout,
        local_attention=local_attention,
        graphdef=graphdef,
        abstract_params=abstract_params,
        batch_sharding=NamedSharding(mesh, layout.token_spec()),
        tx=tx,
        batches=batches,
        schedule=_schedule(cfg),
        eval_batches=eval_batches,
        zero_dims=zero_dims(abstract_params, layout, layer_entry=_layer_entry(cfg)),
        layer_dims=stack_layer_dims(graphdef, abstract_params, layout),
        family=family,
        data_note=data_note,
        **shardings,
    )


def _resolve(cfg: TrainConfig) -> tuple[Family, Any, ModelConfig, list[jax.Device]]:
    """The one place where a run's config is validated and its model resolved: ``(family, the
    text corpus or None, the resolved model config, the devices the mesh uses)``."""
    cfg.validate()
    if cfg.xla_preset is not None:
        xla_presets.check_applied(cfg.xla_preset)
    family = family_of(cfg.model)
    corpus = load_text(family.task, cfg.data)
    model = resolve_model(cfg, corpus.vocab_size if corpus is not None else None)
    devices = jax.devices()
    wanted = cfg.devices if cfg.devices is not None else cfg.parallel.size
    if wanted > len(devices):
        what = (
            f"--devices {cfg.devices}"
            if cfg.devices is not None
            else (f"the mesh {cfg.parallel.short()} needs {wanted} devices")
        )
        hint = f"; {devices_hint(wanted, len(devices))}" if devices[0].platform == "cpu" else ""
        raise ConfigError(f"{what} but only {len(devices)} are available{hint}")
    if cfg.devices is not None:
        devices = devices[: cfg.devices]
    return family, corpus, model, devices


def validate_run(cfg: TrainConfig, model: ModelConfig, layout: TensorLayout) -> None:
    """The rules of a run that need the model, checked before anything compiles: those of
    :mod:`colossal_jax.config` (``cfg`` itself was validated by :meth:`TrainConfig.validate`),
    with the memory the devices report as the capacity, and the one that needs the backend:
    the attention kernel. ``layout`` is the run's (its split is the rules' ``tensor_split``)."""

    from colossal_jax.sequence.fused import resolve

    check_with_model(cfg, model, device_capacity(cfg.parallel.size))
    try:
        resolve(cfg.attention, jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32)
    except ValueError as e:
        raise ConfigError(f"{e} (model {cfg.model}, tensor_mode={layout.mode})") from None


def device_capacity(mesh_size: int) -> tuple[int, int] | None:
    """``(bytes, devices sharing them)`` of the first local device: its memory limit, or on a CPU
    the host's memory shared by the simulated devices the mesh uses; None if unknown."""
    import os

    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), 1
    if device.platform == "cpu" and hasattr(os, "sysconf"):
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return host, min(mesh_size, jax.local_device_count())
    return None


def _layer_entry(cfg: TrainConfig) -> str | None:
    """The sharding entry of the stacked parameters' ``layer`` dimension: ``pipe`` when
    pipelined, else unsplit."""
    return "pipe" if cfg.parallel.pipelined else None


def _state_shardings(
    cfg: TrainConfig, layout: TensorLayout, abstract_params: Any, tx: optax.GradientTransformation
) -> dict[str, Any]:
    """The :class:`Run` fields of the state's shardings: parameters and gradients (ZeRO-3 and
    ZeRO-2 split them over ``data``), the optimizer state (ZeRO-1 and up), and with
    ``--offload`` the device shardings the step brings host-resident state to."""
    entry, stage = _layer_entry(cfg), cfg.parallel.zero
    plain = tree_shardings(abstract_params, layout, layer_entry=entry)
    zero = tree_shardings(abstract_params, layout, zero_axis="data", layer_entry=entry)
    params = zero if stage == 3 else plain
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    zero_axis = "data" if stage >= 1 else None
    opt = tree_shardings(abstract_opt, layout, zero_axis=zero_axis, layer_entry=entry)
    return {
        "grad_shardings": zero if stage >= 2 else plain,
        "device_param_shardings": params,
        "device_opt_shardings": opt,
        "opt_shardings": on_host(opt) if cfg.offload in ("optimizer", "params") else opt,
        "param_shardings": on_host(params) if cfg.offload == "params" else params,
    }


def _schedule(cfg: TrainConfig) -> Any:
    """The pipeline schedule of a pipelined run (None otherwise); gradient accumulation composes
    with it as more microbatches per step."""
    if not cfg.parallel.pipelined:
        return None
    from colossal_jax.pipeline.schedule import build as build_schedule

    par = cfg.parallel
    microbatches = par.num_microbatches * grad_accum_of(cfg)
    return build_schedule(par.pipeline, par.pipe, microbatches, par.virtual_stages)


def replicated_leftovers(run: Run) -> list[str]:
    """Parameters ZeRO cannot shard over ``data`` (no dimension divides); they stay whole."""
    return leftovers(run.abstract_params, run.layout, layer_entry=_layer_entry(run.cfg))


def on_host(shardings: Any) -> Any:
    """The same shardings in the host's ``pinned_host`` memory (``--offload``)."""
    return jax.tree.map(
        lambda s: s.with_memory_kind(HOST),
        shardings,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def init_state(run: Run) -> tuple[Any, Any]:
    """Parameters and optimizer state, created directly in their shardings (with
    ``init_from_hf``: the parameters read from that Hugging Face directory into them)."""
    model_cfg, seed, family = run.model, run.cfg.seed, family_of(run.cfg.model)
    if run.cfg.init_from_hf is not None:
        from colossal_jax.hf.load import load_params

        params = load_params(run)
        return params, jax.jit(run.tx.init, out_shardings=run.opt_shardings)(params)

    def init():
        params = nnx.state(family.build(model_cfg, rngs=nnx.Rngs(seed)))
        return params, run.tx.init(params)

    init = jax.jit(init, out_shardings=(run.param_shardings, run.opt_shardings))
    return init()


def start_state(
    run: Run, ckpt: Checkpointer | None, log: Callable[[str], None]
) -> tuple[Any, Any, int]:
    """``(params, opt_state, step)`` a training starts from: the latest checkpoint in ``ckpt``
    that restores (a damaged newer one skipped with a warning on stderr), else
    :func:`init_state` at step 0. ``log`` receives the line that says where it resumed (process
    0 passes its log, the others a no-op)."""
    is_main = jax.process_index() == 0
    params, opt_state = init_state(run)
    if ckpt is None or ckpt.latest_step() is None:
        return params, opt_state, 0
    target = {
        "params": abstract_like(params, run.param_shardings),
        "opt_state": abstract_like(opt_state, run.opt_shardings),
    }
    del params, opt_state
    warn = (lambda line: print(line, file=sys.stderr, flush=True)) if is_main else None
    restored = ckpt.restore_latest(target, warn or (lambda _: None))
    assert restored is not None  # latest_step() saw one; a failure raises
    state, meta, _ = restored
    step, cfg = int(meta["step"]), run.cfg
    if int(meta.get("seed", cfg.seed)) != cfg.seed:
        raise ConfigError(
            f"--seed {cfg.seed} differs from the checkpoint's seed {meta['seed']} in "
            f"{cfg.checkpoint_dir}; use --seed {meta['seed']} or another --checkpoint-dir"
        )
    log(f"resumed from {ckpt.directory} at step {step}")
    return state["params"], state["opt_state"], step


def restore(run: Run, checkpoint_dir: str, step: int | None = None) -> tuple[Any, Any, int]:
    """``(params, opt_state, step)`` of a checkpoint (default: the latest that restores; a
    damaged newer one is skipped with a warning on stderr), placed in the shardings of ``run``
    (whose mesh may differ from the one that saved it). Reads only: safe on the directory of a
    running training."""
    ckpt = Checkpointer(checkpoint_dir, run.cfg.checkpoint_every, read_only=True)
    try:
        target = {
            "params": abstract_like(run.abstract_params, run.param_shardings),
            "opt_state": abstract_like(
                jax.eval_shape(run.tx.init, run.abstract_params), run.opt_shardings
            ),
        }
        if step is None:
            restored = ckpt.restore_latest(target, lambda line: print(line, file=sys.stderr))
            if restored is None:
                raise ConfigError(
                    f"no checkpoint in {ckpt.directory}; train with checkpoint_dir set"
                )
            state, meta, _ = restored
        else:
            state, meta = ckpt.restore(step, target)
    finally:
        ckpt.close()
    return state["params"], state["opt_state"], int(meta["step"])
