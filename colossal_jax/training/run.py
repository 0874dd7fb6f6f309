"""A run built before any step executes from its resolved :class:`Plan`: the mesh, every
sharding, the optimizer and the data, and the state created (or restored) in those shardings.

Data flow: ``Plan`` (:func:`colossal_jax.checks.resolve.resolve`: the config validated, the
model resolved) → mesh → layout → model built abstractly → shardings from parameter roles (+ ZeRO
over ``data``) → parameters and optimizer state initialised directly in their shardings, or
restored from the latest checkpoint.
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

from colossal_jax.checks.resolve import resolve
from colossal_jax.config import ConfigError, TrainConfig, xla_presets
from colossal_jax.config.families import Family, ModelConfig, family_of
from colossal_jax.config.plan import Plan
from colossal_jax.data.tasks import TaskBatches, load_text, make_batches
from colossal_jax.parallel.mesh import mesh_of
from colossal_jax.parallel.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.parallel.step import stack_layer_dims
from colossal_jax.parallel.zero import leftovers, zero_dims
from colossal_jax.runtime.devices import current_devices
from colossal_jax.tensor.layout import LocalAttention, TensorLayout
from colossal_jax.training.checkpoint import Checkpointer, abstract_like
from colossal_jax.training.optim import make_optimizer

HOST = "pinned_host"
"""The memory kind of offloaded state (``--offload``)."""


@dataclass
class Run:
    """Everything built for a run, before any step executes: ``plan`` is what it was built
    from (``cfg`` is ``plan.config``), ``model`` the resolved config of ``family``
    (:mod:`colossal_jax.config.families`), ``batches``/``eval_batches`` its task's data
    (:mod:`colossal_jax.data.tasks`), ``data_note`` a line about the data to print, or None.
    ``param_shardings``/``opt_shardings`` are where the state lives between steps (the host's
    memory with ``--offload``), ``device_*_shardings`` where the step computes on it."""

    plan: Plan
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
        return self.plan.task


def build(plan: Plan | TrainConfig) -> Run:
    """The run of ``plan``: its mesh over the first ``plan.n_devices`` devices, the layout, the
    model built abstractly, every sharding, the optimizer and the data. A :class:`TrainConfig`
    is resolved first, once, for the devices JAX has (:func:`~colossal_jax.checks.resolve.
    resolve` with :func:`~colossal_jax.runtime.devices.current_devices`). Nothing the plan
    settled is validated again; only what needs the backend is checked here: an
    ``--xla-preset`` in effect, and the attention kernel."""
    if isinstance(plan, TrainConfig):
        plan = resolve(plan, current_devices())
    cfg, model = plan.config, plan.model
    if cfg.xla_preset is not None:
        xla_presets.check_applied(cfg.xla_preset)
    family = family_of(cfg.model)
    corpus = load_text(plan.task, cfg.data)
    mesh = mesh_of(plan)
    layout = make_layout(cfg.parallel, mesh)
    _check_attention(cfg, layout)
    local_attention = make_local_attention(cfg.parallel, implementation=cfg.attention)

    abstract_model = nnx.eval_shape(lambda: family.build(model, rngs=nnx.Rngs(cfg.seed)))
    graphdef, abstract_params = nnx.split(abstract_model)
    tx = make_optimizer(cfg.optim, cfg.steps)
    if cfg.precision == "fp16":
        from colossal_jax.training.loss_scale import with_dynamic_scale

        tx = with_dynamic_scale(tx)
    shardings = _state_shardings(plan, layout, abstract_params, tx)
    order = None
    if plan.zigzag:
        from colossal_jax.sequence.zigzag import zigzag_permutation

        order = zigzag_permutation(cfg.seq_len, cfg.parallel.seq)
    batches, eval_batches, data_note = make_batches(cfg, plan.task, model, corpus, order)
    return Run(
        plan=plan,
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
        schedule=_schedule(plan),
        eval_batches=eval_batches,
        zero_dims=zero_dims(abstract_params, layout, layer_entry=plan.layer_entry),
        layer_dims=stack_layer_dims(graphdef, abstract_params, layout),
        family=family,
        data_note=data_note,
        **shardings,
    )


def _check_attention(cfg: TrainConfig, layout: TensorLayout) -> None:
    """The rule that needs the backend: ``--attention`` has a kernel for the run's dtype here."""
    from colossal_jax.sequence.fused import resolve as resolve_kernel

    try:
        resolve_kernel(cfg.attention, jnp.bfloat16 if cfg.precision == "bf16" else jnp.float32)
    except ValueError as e:
        raise ConfigError(f"{e} (model {cfg.model}, tensor_mode={layout.mode})") from None


def _state_shardings(
    plan: Plan, layout: TensorLayout, abstract_params: Any, tx: optax.GradientTransformation
) -> dict[str, Any]:
    """The :class:`Run` fields of the state's shardings: parameters and gradients (ZeRO-3 and
    ZeRO-2 split them over ``data``), the optimizer state (ZeRO-1 and up), and with
    ``--offload`` the device shardings the step brings host-resident state to."""
    entry, stage = plan.layer_entry, plan.zero
    # a pipeline splits its stack over pipe, and the unstacked parameters too (where a
    # dimension divides): each stage stores 1/p of them (pipeline/step.py gathers them)
    split = {"layer_entry": entry, "rest_axis": entry}
    plain = tree_shardings(abstract_params, layout, **split)
    zero = tree_shardings(abstract_params, layout, zero_axis="data", **split)
    params = zero if stage == 3 else plain
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    zero_axis = "data" if stage >= 1 else None
    opt = tree_shardings(abstract_opt, layout, zero_axis=zero_axis, **split)
    return {
        "grad_shardings": zero if stage >= 2 else plain,
        "device_param_shardings": params,
        "device_opt_shardings": opt,
        "opt_shardings": on_host(opt) if plan.offload in ("optimizer", "params") else opt,
        "param_shardings": on_host(params) if plan.offload == "params" else params,
    }


def _schedule(plan: Plan) -> Any:
    """The pipeline schedule of a pipelined run (None otherwise); gradient accumulation composes
    with it as more microbatches per step (:attr:`Plan.schedule_microbatches`)."""
    if not plan.pipelined:
        return None
    from colossal_jax.pipeline.schedule import build as build_schedule

    pipe = plan.config.parallel.pipe
    return build_schedule(plan.pipeline, pipe, plan.schedule_microbatches, plan.virtual_stages)


def replicated_leftovers(run: Run) -> list[str]:
    """Parameters ZeRO cannot shard over ``data`` (no dimension divides); they stay whole."""
    return leftovers(run.abstract_params, run.layout, layer_entry=run.plan.layer_entry)


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
    if restored is None:  # every checkpoint there was damaged, and was moved aside
        return (*init_state(run), 0)
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
