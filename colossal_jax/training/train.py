"""The training run: state created in its shardings, the jitted step, the loop.

Data flow: ``TrainConfig`` (validated) → mesh → layout → model built abstractly → shardings
from parameter roles (+ ZeRO-1 over ``data`` for the optimizer state) → parameters and optimizer
state initialised directly in their shardings → restore the latest checkpoint → per-step global
batches assembled from per-process data → jitted step → metrics → async checkpoints.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import signal
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.checks.validate import resolve_model
from colossal_jax.config import ConfigError, TrainConfig, xla_presets
from colossal_jax.config.families import Family, ModelConfig, family_of
from colossal_jax.config.model_rules import check_with_model, grad_accum_of
from colossal_jax.config.parallel_rules import uses_zigzag
from colossal_jax.config.train_rules import host_overlap
from colossal_jax.data.tasks import TaskBatches, load_text, make_batches
from colossal_jax.layers import use_parallelism
from colossal_jax.parallel.mesh import build_mesh
from colossal_jax.parallel.sharding import make_layout, make_local_attention, tree_shardings
from colossal_jax.parallel.step import sharded_value_and_grad, stack_layer_dims
from colossal_jax.parallel.zero import leftovers, zero_dims
from colossal_jax.runtime import signals, watchdog
from colossal_jax.runtime.devices import devices_hint
from colossal_jax.runtime.divergence import Diverged, Guard, stop_line
from colossal_jax.runtime.metrics import MetricsWriter, device_memory, peak_flops
from colossal_jax.runtime.profiling import StepProfiler
from colossal_jax.tensor.layout import LocalAttention, TensorLayout
from colossal_jax.training.checkpoint import Checkpointer, abstract_like
from colossal_jax.training.optim import make_optimizer, schedule_values


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


@dataclass
class Run:
    """Everything built for a run, before any step executes: ``model`` is the resolved config
    of ``family`` (:mod:`colossal_jax_models.registry`), ``batches``/``eval_batches`` its task's
    data
    (:mod:`colossal_jax.data.tasks`), ``data_note`` a line about the data to print, or None."""

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
    mesh = build_mesh(cfg.parallel, devices)
    layout = make_layout(cfg.parallel, mesh)
    validate_run(cfg, model, layout)
    local_attention = make_local_attention(cfg.parallel, implementation=cfg.attention)

    abstract_model = nnx.eval_shape(lambda: family.build(model, rngs=nnx.Rngs(cfg.seed)))
    graphdef, abstract_params = nnx.split(abstract_model)
    layer_entry = "pipe" if cfg.parallel.pipelined else None
    stage = cfg.parallel.zero
    plain_shardings = tree_shardings(abstract_params, layout, layer_entry=layer_entry)
    zero_shardings = tree_shardings(
        abstract_params, layout, zero_axis="data", layer_entry=layer_entry
    )
    param_shardings = zero_shardings if stage == 3 else plain_shardings
    grad_shardings = zero_shardings if stage >= 2 else plain_shardings
    tx = make_optimizer(cfg.optim, cfg.steps)
    if cfg.precision == "fp16":
        from colossal_jax.training.loss_scale import with_dynamic_scale

        tx = with_dynamic_scale(tx)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    zero_axis = "data" if stage >= 1 else None
    opt_shardings = tree_shardings(
        abstract_opt, layout, zero_axis=zero_axis, layer_entry=layer_entry
    )
    # --offload: where the state lives between steps (the step brings it to the device)
    device_param_shardings, device_opt_shardings = param_shardings, opt_shardings
    if cfg.offload in ("optimizer", "params"):
        opt_shardings = on_host(opt_shardings)
    if cfg.offload == "params":
        param_shardings = on_host(param_shardings)
    schedule = None
    if cfg.parallel.pipelined:
        from colossal_jax.pipeline.schedule import build as build_schedule

        par = cfg.parallel
        # gradient accumulation composes with the pipeline as more microbatches per step
        schedule = build_schedule(
            par.pipeline, par.pipe, par.num_microbatches * grad_accum_of(cfg), par.virtual_stages
        )

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
        param_shardings=param_shardings,
        opt_shardings=opt_shardings,
        batch_sharding=NamedSharding(mesh, layout.token_spec()),
        tx=tx,
        batches=batches,
        schedule=schedule,
        eval_batches=eval_batches,
        grad_shardings=grad_shardings,
        zero_dims=zero_dims(abstract_params, layout, layer_entry=layer_entry),
        layer_dims=stack_layer_dims(graphdef, abstract_params, layout),
        device_param_shardings=device_param_shardings,
        device_opt_shardings=device_opt_shardings,
        family=family,
        data_note=data_note,
    )


HOST = "pinned_host"


def replicated_leftovers(run: Run) -> list[str]:
    """Parameters ZeRO cannot shard over ``data`` (no dimension divides); they stay whole."""
    entry = "pipe" if run.cfg.parallel.pipelined else None
    return leftovers(run.abstract_params, run.layout, layer_entry=entry)


def on_host(shardings: Any) -> Any:
    """The same shardings in the host's ``pinned_host`` memory (``--offload``)."""
    return jax.tree.map(
        lambda s: s.with_memory_kind(HOST),
        shardings,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def to_device(tree: Any, device_shardings: Any, shardings: Any) -> Any:
    """Inside a jitted step: bring host-resident (offloaded) state to device memory; a no-op for
    state that already lives there."""
    if device_shardings is shardings:
        return tree
    return jax.device_put(tree, device_shardings)


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


COMPUTE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def _loss_fn(run: Run) -> Callable:
    """The unpipelined mean loss ``(params, batch) -> loss`` (compute dtype cast inside)."""
    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]

    def loss_fn(params, batch):
        if compute_dtype != jnp.float32:
            params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
        with use_parallelism(run.layout, run.local_attention):
            model = nnx.merge(run.graphdef, params)
            return model.loss(
                batch["tokens"], batch["positions"], batch["targets"], batch["weights"]
            )

    return loss_fn


def _value_and_grad_fn(run: Run) -> Callable:
    """``(params, batch, scale) -> (loss, grads)``: the all-manual step with ZeRO and gradient
    accumulation (:mod:`colossal_jax.parallel.step`), or the pipeline executor. ``scale``
    multiplies the
    loss before differentiation (fp16 loss scaling); the gradients come back scaled."""
    from colossal_jax.parallel.remat import RematPolicy

    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]
    if run.schedule is None:
        return sharded_value_and_grad(
            run.graphdef,
            run.layout,
            run.local_attention,
            param_specs=_specs(run.param_shardings),
            grad_specs=_specs(run.grad_shardings),
            dims=run.zero_dims,
            layer_dims=run.layer_dims,
            stage=run.cfg.parallel.zero,
            accum=grad_accum_of(run.cfg),
            remat=RematPolicy(run.cfg.remat).policy(),
            compute_dtype=compute_dtype,
        )
    from colossal_jax.pipeline.step import pipelined_value_and_grad

    return pipelined_value_and_grad(
        run.graphdef,
        run.schedule,
        run.layout,
        run.local_attention,
        n_layer=run.model.n_layer,
        compute_dtype=compute_dtype,
        stage=run.cfg.parallel.zero,
        layer_dims=run.layer_dims,
        remat=RematPolicy(run.cfg.remat).policy(),
    )


def _specs(shardings: Any) -> Any:
    return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def make_eval_step(run: Run) -> Callable:
    """The jitted forward ``(params, batch) -> metrics``, in the training step's shardings:
    ``loss`` (the batch's mean weighted loss), ``count`` (its sum of weights) and, for image
    classification, ``correct`` (the weight of the examples whose class logit is the largest).

    A pipelined run evaluates its loss through the same pipelined function as training and
    drops the gradients (its stacked parameters stay split over ``pipe``); its accuracy comes
    from a plain forward, for which XLA gathers the stack over ``pipe``."""
    if run.schedule is None:
        loss_fn = _loss_fn(run)
    else:
        value_and_grad = _value_and_grad_fn(run)

        def loss_fn(params, batch):
            return value_and_grad(params, batch)[0]

    accuracy = _reports_accuracy(run)

    def on_device_metrics(params, batch):
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        out = {"loss": loss_fn(params, batch), "count": jnp.sum(batch["weights"])}
        if accuracy:
            out["correct"] = _correct(run, params, batch)
        return out

    batch_shardings = {k: run.batch_sharding for k in ("tokens", "targets", "positions", "weights")}
    return jax.jit(on_device_metrics, in_shardings=(run.param_shardings, batch_shardings))


def _reports_accuracy(run: Run) -> bool:
    return run.task == "image_classification"


def _correct(run: Run, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """``Σ weight · [argmax over the real classes == target]`` of a forward pass."""
    compute_dtype = COMPUTE_DTYPES[run.cfg.precision]
    if compute_dtype != jnp.float32:
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    tokens, positions = batch["tokens"], batch["positions"]
    with use_parallelism(run.layout, run.local_attention):
        model = nnx.merge(run.graphdef, params)
        logits = model.logits(model.blocks(model.embed(tokens, positions), positions))
    classes = getattr(run.model, "num_classes", logits.shape[-1])
    hit = jnp.argmax(logits[..., :classes], axis=-1) == batch["targets"]
    return jnp.sum(batch["weights"] * hit.astype(jnp.float32))


def eval_data(run: Run) -> list[dict[str, jax.Array]]:
    """The fixed held-out batches of every evaluation (empty without a held-out split):
    ``eval_batches`` of them, or for images as many as cover the held-out images once."""
    if run.eval_batches is None:
        return []
    n = run.eval_batches.evaluation_batches(run.cfg.eval_batches)
    return [_place(run, run.eval_batches.batch(i)) for i in range(n)]


def evaluate_metrics(
    run: Run,
    params: Any,
    *,
    step_fn: Callable | None = None,
    data: list[dict[str, jax.Array]] | None = None,
) -> dict[str, float] | None:
    """Held-out metrics of ``params``: ``eval_loss`` (the weighted mean over the held-out
    batches) and, for image classification, ``eval_accuracy`` (a fraction); None without a
    held-out split. ``params`` must be in ``run.param_shardings``; ``step_fn``/``data`` reuse a
    compiled :func:`make_eval_step` and :func:`eval_data`."""
    data = eval_data(run) if data is None else data
    if not data:
        return None
    step_fn = make_eval_step(run) if step_fn is None else step_fn
    outs = [jax.device_get(step_fn(params, b)) for b in data]
    count = sum(float(o["count"]) for o in outs)
    weight = max(count, 1.0)
    metrics = {"eval_loss": sum(float(o["loss"]) * float(o["count"]) for o in outs) / weight}
    if "correct" in outs[0]:
        metrics["eval_accuracy"] = sum(float(o["correct"]) for o in outs) / weight
    return metrics


def evaluate(
    run: Run,
    params: Any,
    *,
    step_fn: Callable | None = None,
    data: list[dict[str, jax.Array]] | None = None,
) -> float | None:
    """Held-out loss of ``params`` (None without a held-out split); see
    :func:`evaluate_metrics` for the accuracy of image classifiers."""
    metrics = evaluate_metrics(run, params, step_fn=step_fn, data=data)
    return None if metrics is None else metrics["eval_loss"]


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


def make_train_step(run: Run) -> Callable:
    """The jitted step ``(params, opt_state, batch) -> (params, opt_state, metrics)``."""
    value_and_grad = _value_and_grad_fn(run)
    if run.cfg.precision == "fp16":
        return _jit_step(run, _loss_scaled_step(run, value_and_grad))

    def step(params, opt_state, batch):
        batch, stop = _split_stop(batch)
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        opt_state = to_device(opt_state, run.device_opt_shardings, run.opt_shardings)
        loss, grads = value_and_grad(params, batch)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = run.tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": grad_norm, "stop": stop}

    return _jit_step(run, step)


def _loss_scaled_step(run: Run, value_and_grad: Callable) -> Callable:
    """fp16: scale the loss, unscale and check the gradients, skip a non-finite step (parameters
    and optimizer state unchanged, scale halved), grow the scale after clean steps."""
    from colossal_jax.training import loss_scale as ls

    def step(params, opt_state, batch):
        batch, stop = _split_stop(batch)
        params = to_device(params, run.device_param_shardings, run.param_shardings)
        opt_state = to_device(opt_state, run.device_opt_shardings, run.opt_shardings)
        scale_state = opt_state.loss_scale
        loss, grads = value_and_grad(params, batch, scale_state.scale)
        grads, finite = ls.unscale_and_check(scale_state, grads)
        grad_norm = optax.tree.norm(grads)
        updates, new_opt = run.tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = ls.select_if_finite(finite, (new_params, new_opt), (params, opt_state))
        new_scale = ls.update_scale(scale_state, finite)
        opt_state = opt_state._replace(loss_scale=new_scale)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "loss_scale": scale_state.scale,
            "skipped_steps": new_scale.skipped,
            "stop": stop,
        }
        return params, opt_state, metrics

    return step


def _jit_step(run: Run, step: Callable) -> Callable:
    """``step`` jitted in the run's shardings, parameters and optimizer state donated."""
    batch_shardings = {k: run.batch_sharding for k in ("tokens", "targets", "positions", "weights")}
    batch_shardings["stop"] = stop_sharding(run.mesh)
    return jax.jit(
        step,
        in_shardings=(run.param_shardings, run.opt_shardings, batch_shardings),
        out_shardings=(run.param_shardings, run.opt_shardings, None),
        donate_argnums=(0, 1),
    )


def _split_stop(batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], jax.Array]:
    """``(the model's batch, the largest stop flag of any process)`` — see :func:`stop_flags`."""
    batch = dict(batch)
    return batch, jnp.max(batch.pop("stop"))


def stop_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """One element per device: ``[mesh.size]`` split over every mesh axis."""
    return NamedSharding(mesh, P(tuple(mesh.axis_names)))


def stop_flags(mesh: jax.sharding.Mesh) -> jax.Array:
    """This process's stop request on each of its devices: the number of the SIGINT/SIGTERM it
    received (:mod:`colossal_jax.runtime.signals`), 0 if none. The step returns the largest flag of
    any
    device as its ``stop`` metric, so the processes of a multi-process run learn of a signal that
    any one of them received at the same step, and stop and save together."""
    flag = signals.received() or 0
    host = np.full((mesh.size,), int(flag), np.int32)
    return jax.make_array_from_callback(host.shape, stop_sharding(mesh), lambda idx: host[idx])


def global_batch(run: Run, step: int) -> dict[str, jax.Array]:
    """The batch of ``step`` as global arrays (each process builds only its addressable shards)
    with this process's :func:`stop_flags` under ``"stop"``."""
    batch = _place(run, run.batches.batch(step))
    batch["stop"] = stop_flags(run.mesh)
    return batch


def _place(run: Run, host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
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
    """What ``train`` returns: the losses, speed and the trained state.

    Attributes:
      steps_run, start_step, final_step: steps this call ran, and where it started and ended.
      losses: training loss of every step this call ran; first_loss, final_loss its ends.
      tokens_per_s, mfu: throughput (MFU None where the device's peak is unknown).
      compile_s, wall_s: compile time of the train step; wall time of the whole call.
      loop_s: wall time of the step loop, without its evaluations and checkpoint saves.
      host_s: the part of ``loop_s`` the host spent on its own work: neither inside the
        compiled step's call (which returns once the step is queued: at once on a GPU; on a
        CPU only after the step before it has finished) nor waiting for a step's results. With
        ``host_overlap`` on this work overlaps the step in flight, so ``host_s / loop_s``
        bounds from above the share of the loop the device waited on the host; off (a CPU's
        default) the device waits for all of it.
      step_times: seconds of each step this call ran, as the host saw them: from the previous
        step's results (the loop's start, or the end of an evaluation or checkpoint save) to its
        own, so they add up to ``loop_s``, the host's own work included (the first step's
        includes the new executable's first-run set-up).
      eval_losses: ``(step, held-out loss)`` of every evaluation (step 0: before training);
        first_eval_loss, final_eval_loss: its ends (None when evaluation is off).
      eval_accuracies: ``(step, held-out accuracy)`` of every evaluation of an image classifier
        (empty for other tasks); first_eval_accuracy, final_eval_accuracy: its ends.
      params, opt_state: the final parameters (an ``nnx.State``) and optimizer state, as arrays
        in their shardings; ``nnx.merge(run.graphdef, params)`` gives the model.
      run: the built :class:`Run` (mesh, shardings, data).
    """

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
    loop_s: float = 0.0
    step_times: list[float] = field(default_factory=list)
    host_s: float = 0.0
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    first_eval_loss: float | None = None
    final_eval_loss: float | None = None
    eval_accuracies: list[tuple[int, float]] = field(default_factory=list)
    params: Any = field(default=None, repr=False)
    opt_state: Any = field(default=None, repr=False)
    run: Run | None = field(default=None, repr=False)

    @property
    def first_eval_accuracy(self) -> float | None:
        return self.eval_accuracies[0][1] if self.eval_accuracies else None

    @property
    def final_eval_accuracy(self) -> float | None:
        return self.eval_accuracies[-1][1] if self.eval_accuracies else None


TrainResult = Summary
"""The result of :func:`train` (another name of :class:`Summary`)."""


def train(
    cfg: TrainConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Summary:
    """Run (or resume) ``cfg`` to ``cfg.steps``; returns a :class:`Summary` with the per-step
    losses of this process, the held-out losses and the trained ``params``/``opt_state``.

    With ``cfg.checkpoint_dir`` set it resumes from the latest checkpoint there (skipping, with a
    warning, a damaged one for the one before it). ``log`` receives each line of output;
    ``progress`` shows a progress bar.

    Raises :class:`colossal_jax.runtime.divergence.Diverged` at the first step whose loss or
    gradient
    norm is not finite (fp16: see that module), before that step is saved, and, once
    :func:`colossal_jax.runtime.signals.install` has been called,
    :class:`colossal_jax.runtime.signals.Interrupted`
    after SIGINT/SIGTERM, with a checkpoint of the step reached."""
    t_start = time.perf_counter()
    if cfg.checkpoint_dir is not None:
        from colossal_jax.checks.preflight import check_resume

        check_resume(cfg)  # as cli.main does: a checkpoint of another model is one line, at once
    run = build(cfg)
    is_main = jax.process_index() == 0
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(run.abstract_params))
    if is_main:
        log(f"{cfg.parallel.describe()}")
        log(
            f"model {cfg.model} ({run.task}): {n_params / 1e6:.2f}M parameters, "
            f"layers={run.model.n_layer} hidden={run.model.n_embd} heads={run.model.n_head} "
            f"{_outputs(run.model)}; data {run.batches.name}; batch "
            f"{cfg.batch_size}×{cfg.seq_len} tokens"
            f"{_accumulation(cfg)}; "
            f"{cfg.optim.name} lr={cfg.optim.lr} precision={cfg.precision}"
        )

        if cfg.init_from_hf is not None:
            log(f"init: the weights of {cfg.init_from_hf} (a checkpoint to resume wins)")
        if cfg.parallel.zero >= 1 and (rest := replicated_leftovers(run)):
            log(
                f"ZeRO-{cfg.parallel.zero}: {len(rest)} parameter(s) have no dimension divisible "
                f"by data={cfg.parallel.data} and stay replicated: {', '.join(rest)}"
            )
    _stop_if_signalled(None, 0, started=False)
    ckpt = (
        Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, max_to_keep=cfg.keep_checkpoints)
        if cfg.checkpoint_dir
        else None
    )
    try:
        return _train(cfg, run, ckpt, t_start=t_start, progress=progress, log=log)
    finally:
        if ckpt is not None:
            ckpt.close()


def _train(
    cfg: TrainConfig,
    run: Run,
    ckpt: Checkpointer | None,
    *,
    t_start: float,
    progress: bool,
    log: Callable[[str], None],
) -> Summary:
    """The body of :func:`train` once the run is built (``ckpt`` is closed by the caller)."""
    is_main = jax.process_index() == 0
    params, opt_state = init_state(run)
    start_step = 0
    if ckpt is not None and ckpt.latest_step() is not None:
        target = {
            "params": abstract_like(params, run.param_shardings),
            "opt_state": abstract_like(opt_state, run.opt_shardings),
        }
        del params, opt_state
        warn = (lambda line: print(line, file=sys.stderr, flush=True)) if is_main else None
        restored = ckpt.restore_latest(target, warn or (lambda _: None))
        assert restored is not None  # latest_step() saw one; a failure raises
        state, meta, _ = restored
        params, opt_state = state["params"], state["opt_state"]
        start_step = int(meta["step"])
        if int(meta.get("seed", cfg.seed)) != cfg.seed:
            raise ConfigError(
                f"--seed {cfg.seed} differs from the checkpoint's seed {meta['seed']} in "
                f"{cfg.checkpoint_dir}; use --seed {meta['seed']} or another --checkpoint-dir"
            )
        if is_main:
            log(f"resumed from {ckpt.directory} at step {start_step}")
    _stop_if_signalled(ckpt, start_step, started=False)

    step_fn = make_train_step(run)
    t0 = time.perf_counter()
    compiled = step_fn.lower(params, opt_state, global_batch(run, start_step)).compile()
    compile_s = time.perf_counter() - t0
    if is_main:
        log(f"compiled the train step in {compile_s:.1f}s")
    _stop_if_signalled(ckpt, start_step, started=False)

    lr_values = schedule_values(cfg.optim, cfg.steps, start_step, cfg.steps)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    flops_per_step = run.model.flops_per_token(cfg.seq_len) * tokens_per_step
    peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops()
    for note in (run.data_note, run.batches.epochs(cfg.steps)):
        if is_main and note:
            log(f"note: {note}")
    eval_fn, eval_batches = None, []
    if cfg.eval_every and run.eval_batches is not None and start_step < cfg.steps:
        eval_fn, eval_batches = make_eval_step(run), eval_data(run)
    eval_losses: list[tuple[int, float]] = []
    eval_accuracies: list[tuple[int, float]] = []

    def run_eval(at: int) -> dict[str, float]:
        metrics = evaluate_metrics(run, params, step_fn=eval_fn, data=eval_batches)
        assert metrics is not None  # eval_fn is set only with a held-out split
        eval_losses.append((at, metrics["eval_loss"]))
        if "eval_accuracy" in metrics:
            eval_accuracies.append((at, metrics["eval_accuracy"]))
        return metrics

    n_dev = run.mesh.size
    guard = Guard(skipped=_skipped_so_far(opt_state))
    writer = MetricsWriter(cfg.metrics_file, cfg.tensorboard_dir, resume_step=start_step)
    bar = None
    losses: list[float] = []
    step_times: list[float] = []
    step = start_step
    profiler = StepProfiler.of(cfg)  # --profile-dir: a trace of --profile-steps
    agreed_signal = 0  # the largest stop flag of any process, once one is seen
    mark = 0.0  # where the next step's time starts: the last results read, or a pause's end
    paused = 0.0  # seconds of the loop spent in evaluation and checkpoint saves
    in_step = 0.0  # seconds of the loop inside the compiled step's call or waiting for results

    def finish(at: int, out: dict) -> None:
        """Read step ``at``'s metrics (waiting for it), check them, log them."""
        nonlocal mark, agreed_signal, in_step
        t_wait = time.perf_counter()
        host = jax.device_get(out)
        now = time.perf_counter()
        in_step += now - t_wait
        # the interval between results: the steps' times tile the loop, host work included
        dt = now - mark
        mark = now
        loss = float(host["loss"])
        losses.append(loss)
        step_times.append(dt)
        tps = tokens_per_step / dt
        record = {
            "step": at,
            "loss": loss,
            "lr": float(lr_values[at - 1 - start_step]),
            "grad_norm": float(host["grad_norm"]),
            "step_time_s": dt,
            "tokens_per_s": tps,
            "mfu": flops_per_step / dt / (peak * n_dev) if peak else None,
        }
        for key in ("loss_scale", "skipped_steps"):
            if key in host:
                record[key] = host[key].item()
        bad = guard.check(loss, record["grad_norm"], record.get("skipped_steps"))
        if bad is not None:
            writer.write(record)  # the record of the failed step, for the post-mortem
            last_good = ckpt.wait() if ckpt is not None else None
            raise Diverged(at, bad, stop_line(bad, at, cfg.checkpoint_dir, last_good))
        agreed_signal = max(agreed_signal, int(host["stop"]))
        if (mem := device_memory()) is not None:
            record["peak_bytes_in_use"] = mem["peak_bytes_in_use"]
        records.append(record)
        if bar is not None:
            bar.set_postfix({"loss": f"{loss:.4f}", "tok_s": f"{tps:,.0f}"}, refresh=False)
            bar.update(1)

    def log_records(evaluation: dict[str, float] | None = None) -> None:
        """Write the finished steps' records; ``evaluation`` belongs to the last of them."""
        for i, record in enumerate(records):
            evaluated = evaluation is not None and i == len(records) - 1
            if evaluated:
                record.update(evaluation)
                if bar is not None:
                    post = {"loss": f"{record['loss']:.4f}", "eval": f"{eval_losses[-1][1]:.4f}"}
                    if eval_accuracies:
                        post["acc"] = f"{100 * eval_accuracies[-1][1]:.1f}%"
                    bar.set_postfix(post, refresh=False)
            if record["step"] % cfg.log_every == 0 or record["step"] == cfg.steps or evaluated:
                writer.write(record)
        records.clear()

    records: list[dict] = []
    try:
        if eval_fn is not None:
            watchdog.arm(f"the evaluation at step {start_step}")
            first_eval = run_eval(start_step)
            watchdog.disarm()
            if start_step == 0:
                writer.write({"step": 0, **first_eval})
        _stop_if_signalled(ckpt, start_step, started=False)
        if progress and is_main:
            from tqdm import tqdm

            bar = tqdm(
                total=cfg.steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True
            )
        # Overlapped (``host_overlap``; auto: not on a CPU): step k+1 is dispatched (its batch built
        # while step k ran) before step k's metrics are read, so the device never waits on the
        # host. Otherwise, and at a step whose state is evaluated or saved (its parameters are
        # donated to the next step), the step is read at once and the next batch built after.
        # A state is saved only after its loss and gradient norm were checked.
        overlap = host_overlap(cfg.host_overlap, jax.default_backend())
        pending: tuple[int, dict] | None = None
        next_batch = global_batch(run, step)
        loop_start = mark = time.perf_counter()
        while step < cfg.steps:
            watchdog.arm(f"step {step + 1}")  # through its evaluation and save
            profiler.step(step + 1, pending=params)
            t_call = time.perf_counter()
            params, opt_state, out = compiled(params, opt_state, next_batch)
            in_step += time.perf_counter() - t_call
            step += 1
            evaluated = eval_fn is not None and (step % cfg.eval_every == 0 or step == cfg.steps)
            saving = ckpt is not None and (ckpt.due(step) or step == cfg.steps or agreed_signal)
            read_now = not overlap or step == cfg.steps or evaluated or saving or agreed_signal
            if not read_now:
                next_batch = global_batch(run, step)  # while the device runs this step
            if pending is not None:
                finish(*pending)
            pending = (step, out)
            if read_now or agreed_signal:  # finish() may have just seen another's stop flag
                finish(*pending)
                pending = None
                evaluation = None
                if evaluated:
                    t_pause = time.perf_counter()
                    evaluation = run_eval(step)
                    paused += time.perf_counter() - t_pause
                    mark = time.perf_counter()
                log_records(evaluation)
                if ckpt is not None and (saving or agreed_signal):  # the flag may be new
                    t_pause = time.perf_counter()
                    ckpt.save(
                        step,
                        {"params": params, "opt_state": opt_state},
                        _meta(cfg, step, run.model),
                        force=True,
                    )
                    paused += time.perf_counter() - t_pause
                    mark = time.perf_counter()
                if agreed_signal:
                    break
                if step < cfg.steps:
                    next_batch = global_batch(run, step)
            else:
                log_records()
            watchdog.disarm()
        loop_s = time.perf_counter() - loop_start - paused
        host_s = loop_s - in_step
    finally:
        profiler.close(pending=params)
        watchdog.disarm()
        if bar is not None:
            bar.close()
        writer.close()
    if ckpt is not None:
        watchdog.arm(f"the checkpoint of step {step}")
        ckpt.wait()
        watchdog.disarm()
    _stop_if_signalled(ckpt, step, started=step > start_step, agreed=agreed_signal)

    timed_seconds = sum(step_times)
    tokens_per_s = tokens_per_step * len(step_times) / timed_seconds if timed_seconds else None
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
        loop_s=loop_s,
        step_times=step_times,
        host_s=host_s,
        eval_losses=eval_losses,
        first_eval_loss=eval_losses[0][1] if eval_losses else None,
        final_eval_loss=eval_losses[-1][1] if eval_losses else None,
        eval_accuracies=eval_accuracies,
        params=params,
        opt_state=opt_state,
        run=run,
    )
    if is_main:
        log(_summary_line(summary, ckpt))
    return summary


def _skipped_so_far(opt_state: Any) -> int | None:
    """fp16: the loss scaler's count of skipped steps in ``opt_state``; None without one."""
    scale = getattr(opt_state, "loss_scale", None)
    return None if scale is None else int(scale.skipped)


def _stop_if_signalled(
    ckpt: Checkpointer | None, step: int, *, started: bool, agreed: int = 0
) -> None:
    """If SIGINT/SIGTERM arrived (:mod:`colossal_jax.runtime.signals`), or ``agreed`` (the stop
    flag the
    steps agreed on, :func:`stop_flags`) says that another process received one: wait for the
    checkpoint of ``step`` (the loop saved it) and raise :class:`signals.Interrupted` with the
    line that says where it is."""
    own = signals.received()
    signum = own if own is not None else (agreed or None)
    if signum is None:
        return
    head = "interrupted" if signum == signal.SIGINT else f"interrupted by {signals.name(signum)}"
    if own is None:
        head += " (received by another process)"
    latest = ckpt.wait() if ckpt is not None else None
    if not started and step == 0 and latest is None:
        line = f"{head} before the first step; nothing to save"
    elif ckpt is None:
        line = f"{head} at step {step}; nothing saved (no --checkpoint-dir)"
    elif latest == step:
        line = (
            f"{head} at step {step}; checkpoint saved in {ckpt.directory} (re-run the same "
            "command to resume)"
        )
    else:
        line = (
            f"{head} at step {step}; the latest checkpoint is step {latest} in {ckpt.directory} "
            "(re-run the same command to resume)"
        )
    raise signals.Interrupted(signum, line)


def _meta(cfg: TrainConfig, step: int, model: ModelConfig | None = None) -> dict:
    """The JSON saved with a checkpoint; ``architecture`` (the resolved model config, the data's
    vocabulary included) is what ``preflight.check_resume`` compares a resume against."""
    meta = {
        "step": step,
        "data_position": step,  # batches are a pure function of (seed, step)
        "seed": cfg.seed,
        "model": cfg.model,
        "mesh": cfg.parallel.short(),
        "grad_accum": grad_accum_of(cfg),
        "config": _jsonable(dataclasses.asdict(cfg)),
    }
    if model is not None:
        meta["architecture"] = _jsonable(dataclasses.asdict(model))
    return meta


def _outputs(model: ModelConfig) -> str:
    """``vocab=V`` for a language model, ``classes=C (head H)`` for a classifier."""
    classes = getattr(model, "num_classes", None)
    if classes is None:
        return f"vocab={model.vocab_size}"
    return f"classes={classes} (head {model.vocab_size})"


def _accumulation(cfg: TrainConfig) -> str:
    """`` in N microbatches of D per shard`` for the log line, or "" without accumulation."""
    from colossal_jax.config.tensor_split import batch_shards

    accum = grad_accum_of(cfg)
    if accum == 1:
        return ""
    per = cfg.batch_size // (batch_shards(cfg.parallel) * cfg.parallel.num_microbatches * accum)
    return f" accumulated in {accum} microbatches of {per} per batch shard"


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
        (f"eval loss {s.first_eval_loss:.4f} -> {s.final_eval_loss:.4f}" if s.eval_losses else ""),
        (
            f"eval accuracy {100 * s.first_eval_accuracy:.1f}% -> "
            f"{100 * s.final_eval_accuracy:.1f}%"
            if s.first_eval_accuracy is not None and s.final_eval_accuracy is not None
            else ""
        ),
        f"{s.tokens_per_s:,.0f} tokens/s" if s.tokens_per_s else "",
        f"MFU {100 * s.mfu:.1f}%" if s.mfu is not None else "MFU n/a (unknown device peak)",
        f"compile {s.compile_s:.1f}s",
        f"wall {s.wall_s:.1f}s",
    ]
    if ckpt is not None:
        parts.append(f"checkpoints in {ckpt.directory}")
    return "; ".join(p for p in parts if p)


class _CallableModule(types.ModuleType):
    """``colossal_jax.training.train`` names both this module and, exported by the package, the
    function
    :func:`train`; once this module is imported the package attribute may be the module, so
    calling the module calls the function."""

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
sys.modules[__name__].__signature__ = inspect.signature(train)
