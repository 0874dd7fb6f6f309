"""``train(cfg)``: a run resolved once into its plan and built, its state initialised or
resumed, its step compiled, and the loop (:mod:`colossal_jax.training.loop`) run with the
hooks the configuration asks for."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import jax

from colossal_jax.checks.resolve import resolve
from colossal_jax.config import TrainConfig
from colossal_jax.config.families import ModelConfig
from colossal_jax.config.plan import Plan
from colossal_jax.runtime.compile_cache import cache_safe_for
from colossal_jax.runtime.devices import current_devices
from colossal_jax.runtime.metrics import MetricsWriter
from colossal_jax.runtime.profiling import StepProfiler
from colossal_jax.training.checkpoint import Checkpointer
from colossal_jax.training.hooks.checkpoint import Checkpointing
from colossal_jax.training.hooks.divergence import DivergenceGuard
from colossal_jax.training.hooks.evaluation import Evaluation
from colossal_jax.training.hooks.metrics import Metrics
from colossal_jax.training.hooks.profiler import Profiler
from colossal_jax.training.hooks.progress import ProgressBar
from colossal_jax.training.hooks.stop import StopOnSignal, stop_if_signalled
from colossal_jax.training.hooks.watchdog import PeerWatchdog
from colossal_jax.training.loop import Hooks, Loop, compile_step
from colossal_jax.training.records import Rates
from colossal_jax.training.run import Run, build, replicated_leftovers, start_state
from colossal_jax.training.stack_order import to_stored
from colossal_jax.training.summary import Summary, summarize, summary_line


def train(
    cfg: TrainConfig | Plan,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Summary:
    """Run (or resume) ``cfg`` to ``cfg.steps``: a :class:`Plan`, or a :class:`TrainConfig`
    resolved once for the devices JAX has (every rule that needs no device, a checkpoint to
    resume included, runs there, before anything compiles). Returns a :class:`Summary` with the
    per-step losses of this process, the held-out losses and the trained
    ``params``/``opt_state``.

    With ``cfg.checkpoint_dir`` set it resumes from the latest checkpoint there (skipping, with a
    warning, a damaged one for the one before it). ``log`` receives each line of output;
    ``progress`` shows a progress bar.

    Raises :class:`colossal_jax.runtime.divergence.Diverged` at the first step whose loss or
    gradient norm is not finite (fp16: see that module), before that step is saved, and, once
    :func:`colossal_jax.runtime.signals.install` has been called,
    :class:`colossal_jax.runtime.signals.Interrupted` after SIGINT/SIGTERM, with a checkpoint of
    the step reached."""
    t_start = time.perf_counter()
    plan = cfg if isinstance(cfg, Plan) else resolve(cfg, current_devices())
    cfg = plan.config
    ckpt = (  # first: a directory another run holds stops this one before anything is built
        Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, max_to_keep=cfg.keep_checkpoints)
        if cfg.checkpoint_dir
        else None
    )
    try:
        with cache_safe_for(plan.seq_mode, jax.default_backend()) as cache_note:
            run = build(plan)
            if jax.process_index() == 0:
                for line in _header(run) + ([f"note: {cache_note}"] if cache_note else []):
                    log(line)
            stop_if_signalled(None, 0, started=False)
            return _train(run, ckpt, t_start=t_start, progress=progress, log=log)
    finally:
        if ckpt is not None:
            ckpt.close()


def _train(
    run: Run,
    ckpt: Checkpointer | None,
    *,
    t_start: float,
    progress: bool,
    log: Callable[[str], None],
) -> Summary:
    """The body of :func:`train` once the run is built (``ckpt`` is closed by the caller)."""
    cfg, is_main = run.cfg, jax.process_index() == 0
    say = log if is_main else (lambda _: None)
    params, opt_state, start_step = start_state(run, ckpt, say)
    if start_step >= cfg.steps:  # decided before compiling: nothing would run
        summary = Summary(
            steps_run=0, start_step=start_step, final_step=start_step, losses=[],
            first_loss=None, final_loss=None, tokens_per_s=None, mfu=None, compile_s=0.0,
            wall_s=time.perf_counter() - t_start, params=params, opt_state=opt_state, run=run,
        )  # fmt: skip
        say(summary_line(summary, ckpt))
        return summary
    stop_if_signalled(ckpt, start_step, started=False)
    params, opt_state = to_stored(run, params, opt_state)  # chunk order for V > 1 (donated)
    compiled, compile_s = compile_step(run, params, opt_state, start_step)
    say(f"compiled the train step in {compile_s:.1f}s")
    stop_if_signalled(ckpt, start_step, started=False)
    rates = Rates.of(run, start_step)
    for note in (run.data_note, run.batches.epochs(cfg.steps)):
        if note:
            say(f"note: {note}")
    evaluation, hooks = _hooks(run, ckpt, opt_state, start_step, progress=progress and is_main)
    loop = Loop(run, compiled, params, opt_state, start_step, rates, run.plan.host_overlap)
    del params, opt_state  # the loop's now: donated to its first step
    loop.run_steps(hooks)
    summary = summarize(loop, evaluation, compile_s=compile_s, wall_s=time.perf_counter() - t_start)
    say(summary_line(summary, ckpt, run.batches.caveat))
    return summary


def _hooks(
    run: Run, ckpt: Checkpointer | None, opt_state: Any, start_step: int, *, progress: bool
) -> tuple[Evaluation | None, Hooks]:
    """The hooks of ``run``'s loop, in the order of their work within each event (``close``
    runs them in reverse: the profiler stops before the bar and the metrics file close), and
    the evaluation hook (None without evaluation) whose metrics the summary reports."""
    cfg = run.cfg
    writer = MetricsWriter(cfg.metrics_file, cfg.tensorboard_dir, resume_step=start_step)
    evaluation = None
    if cfg.eval_every and run.eval_batches is not None and start_step < cfg.steps:
        evaluation = Evaluation(run, writer, every=cfg.eval_every)
    hooks = Hooks()
    if evaluation is not None:
        hooks.add(evaluation)
    hooks.add(DivergenceGuard(opt_state, writer, ckpt))
    hooks.add(Metrics(writer, every=cfg.log_every))
    if ckpt is not None:
        hooks.add(Checkpointing(ckpt))
    hooks.add(StopOnSignal(ckpt))
    if progress:
        hooks.add(ProgressBar())
    hooks.add(PeerWatchdog())
    if cfg.profile_dir:
        hooks.add(Profiler(StepProfiler.of(cfg)))
    return evaluation, hooks


def _header(run: Run) -> list[str]:
    """The lines a run starts with: the mesh, the model and data, and what they imply."""
    cfg = run.cfg
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(run.abstract_params))
    lines = [
        f"{cfg.parallel.describe()}",
        f"model {cfg.model} ({run.task}): {n_params / 1e6:.2f}M parameters, "
        f"layers={run.model.n_layer} hidden={run.model.n_embd} heads={run.model.n_head} "
        f"{_outputs(run.model)}; data {run.batches.name}; batch "
        f"{cfg.batch_size}×{cfg.seq_len} tokens"
        f"{_accumulation(run.plan)}; "
        f"{cfg.optim.name} lr={cfg.optim.lr} precision={cfg.precision}",
    ]
    if cfg.init_from_hf is not None:
        lines.append(f"init: the weights of {cfg.init_from_hf} (a checkpoint to resume wins)")
    if cfg.parallel.zero >= 1 and (rest := replicated_leftovers(run)):
        lines.append(
            f"ZeRO-{cfg.parallel.zero}: {len(rest)} parameter(s) have no dimension divisible "
            f"by data={cfg.parallel.data} and stay replicated: {', '.join(rest)}"
        )
    return lines


def _outputs(model: ModelConfig) -> str:
    """``vocab=V`` for a language model, ``classes=C (head H)`` for a classifier."""
    classes = getattr(model, "num_classes", None)
    if classes is None:
        return f"vocab={model.vocab_size}"
    return f"classes={classes} (head {model.vocab_size})"


def _accumulation(plan: Plan) -> str:
    """`` in N microbatches of D per shard`` for the log line, or "" without accumulation."""
    if plan.grad_accum == 1:
        return ""
    return (
        f" accumulated in {plan.grad_accum} microbatches of {plan.microbatch_sequences} per "
        "batch shard"
    )
