"""What :func:`colossal_jax.training.trainer.train` returns (:class:`Summary`) and the line it
ends with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from colossal_jax.training.run import Run
from colossal_jax.training.stack_order import to_model

if TYPE_CHECKING:
    from colossal_jax.training.checkpoint import Checkpointer
    from colossal_jax.training.hooks.evaluation import Evaluation
    from colossal_jax.training.loop import Loop


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
"""The result of :func:`~colossal_jax.training.trainer.train` (another name of
:class:`Summary`)."""


def summarize(
    loop: Loop, evaluation: Evaluation | None, *, compile_s: float, wall_s: float
) -> Summary:
    """The :class:`Summary` of a finished ``loop`` (``evaluation``: its evaluation hook, if
    any)."""
    losses, times = loop.losses, loop.step_times
    timed_seconds = sum(times)
    eval_losses = evaluation.losses if evaluation is not None else []
    params, opt_state = to_model(loop.run, loop.params, loop.opt_state)  # the loop is done
    return Summary(
        steps_run=len(losses),
        start_step=loop.start_step,
        final_step=loop.step,
        losses=losses,
        first_loss=losses[0] if losses else None,
        final_loss=losses[-1] if losses else None,
        tokens_per_s=loop.rates.tokens_per_s(len(times), timed_seconds),
        mfu=loop.rates.mfu(len(losses), timed_seconds),
        compile_s=compile_s,
        wall_s=wall_s,
        loop_s=loop.clock.loop_s,
        step_times=times,
        host_s=loop.clock.host_s,
        eval_losses=eval_losses,
        first_eval_loss=eval_losses[0][1] if eval_losses else None,
        final_eval_loss=eval_losses[-1][1] if eval_losses else None,
        eval_accuracies=evaluation.accuracies if evaluation is not None else [],
        params=params,
        opt_state=opt_state,
        run=loop.run,
    )


def summary_line(s: Summary, ckpt: Checkpointer | None, caveat: str | None = None) -> str:
    """``done: steps 0->50; loss 10.8 -> 6.1; …`` (or ``nothing to do`` when no step ran);
    ``caveat``: what the data's note said that the figures depend on (generated images in place
    of the digits), repeated after the accuracy."""
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
        caveat or "",
        f"{s.tokens_per_s:,.0f} tokens/s" if s.tokens_per_s else "",
        f"MFU {100 * s.mfu:.1f}%" if s.mfu is not None else "MFU n/a (unknown device peak)",
        f"compile {s.compile_s:.1f}s",
        f"wall {s.wall_s:.1f}s",
    ]
    if ckpt is not None:
        parts.append(f"checkpoints in {ckpt.directory}")
    return "; ".join(p for p in parts if p)
