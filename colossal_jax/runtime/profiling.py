"""``--profile-dir DIR --profile-steps A:B``: a ``jax.profiler`` trace of training steps A..B.

The training loop calls :meth:`StepProfiler.step` once per step, before dispatching it, and
:meth:`StepProfiler.close` after the loop; everything else lives here. The trace starts before
step A is dispatched and stops once step B's outputs are ready (the loop may dispatch ahead of
the host, so the profiler waits on what it is given), and each step is marked with a
``jax.profiler.StepTraceAnnotation`` so TensorBoard's profile plugin and Perfetto show step
boundaries. Open it with ``tensorboard --logdir DIR`` (profile tab) or load
``DIR/plugins/profile/*/*.trace.json.gz`` / the ``perfetto_trace.json.gz`` in
https://ui.perfetto.dev.
"""

from __future__ import annotations

from typing import Any


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)``; ``ValueError`` for anything else."""
    first, sep, last = text.partition(":")
    if not sep:
        raise ValueError(text)
    return int(first), int(last)


class StepProfiler:
    """Traces steps ``first..last`` (1-based, inclusive) into ``directory``; a no-op without
    one."""

    def __init__(self, directory: str | None, steps: tuple[int, int] | None):
        self.directory = directory
        self.first, self.last = steps if steps is not None else (0, -1)
        self._tracing = False
        self._annotation: Any = None

    @classmethod
    def of(cls, cfg: Any) -> StepProfiler:
        """The profiler ``cfg.profile_dir`` / ``cfg.profile_steps`` ask for (checked by
        :func:`colossal_jax.config.train_rules.check_profile`)."""
        if not cfg.profile_dir:
            return cls(None, None)
        return cls(cfg.profile_dir, parse_steps(cfg.profile_steps))

    def step(self, number: int, pending: Any = None) -> None:
        """Call before dispatching step ``number``; ``pending``: the previous step's outputs
        (waited on before the trace stops)."""
        if self.directory is None:
            return
        import jax

        self._end_annotation()
        if self._tracing and number > self.last:
            self._stop(pending)
        if number == self.first and not self._tracing:
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            self._tracing = True
        if self._tracing:
            self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=number)
            self._annotation.__enter__()

    def close(self, pending: Any = None) -> None:
        """After the loop (also when it raised): stop a trace still running."""
        self._end_annotation()
        if self._tracing:
            self._stop(pending)

    def _end_annotation(self) -> None:
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
            self._annotation = None

    def _stop(self, pending: Any) -> None:
        import jax

        if pending is not None:
            jax.block_until_ready(pending)
        jax.profiler.stop_trace()
        self._tracing = False
