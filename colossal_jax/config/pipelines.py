"""The pipeline schedules, one registered :class:`PipelineSchedule` each: its name and help, the
function that orders each stage's operations, and the properties the rules read.

The built-in schedules — ``none`` (no pipeline), ``gpipe``, ``1f1b`` and ``interleaved`` — are
registered at the bottom of this module. A new schedule is its order function (``(p, m, v) ->
per stage, its operations``, :mod:`colossal_jax.pipeline.schedule`, which times and allocates any
order) and one :func:`register` call. Nothing here imports the pipeline floor: the order is a
``"package.module:Name"`` reference imported when a schedule is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from colossal_jax.config.registry import Reference, Registry, resolve


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule.

    Attributes:
      name: the ``--pipeline`` value.
      help: one line saying what it is.
      order: ``order(p, m, v) -> list[list[Op]]``, each stage's forward and backward operations
        in execution order (:func:`colossal_jax.pipeline.schedule.stage_orders`), a
        ``"package.module:Name"`` reference or the function; None for ``none``, which runs no
        pipeline.
      virtual: it runs ``V >= 2`` model chunks per stage (``--virtual-stages``), sending
        microbatches in groups of ``pipe`` (interleaved 1F1B).
    """

    name: str
    help: str
    order: Reference | None
    virtual: bool = False

    @property
    def pipelined(self) -> bool:
        """It runs stages over a ``pipe`` axis (every schedule but ``none``)."""
        return self.order is not None

    def order_function(self):
        """The order function (imports the pipeline floor)."""
        if self.order is None:
            raise ValueError(f"--pipeline {self.name} runs no pipeline stages")
        return resolve(self.order)


TABLE: Registry[PipelineSchedule] = Registry("pipeline schedule", "--pipeline")
"""Every schedule, by name, in registration order."""
register = TABLE.register
unregister = TABLE.unregister


def pipeline_schedule(name: str) -> PipelineSchedule:
    """The registered schedule ``name``; :class:`ConfigError` names the registered ones."""
    return TABLE.get(name)


register(PipelineSchedule("none", "no pipeline (pipe=1)", None))
register(
    PipelineSchedule(
        "gpipe",
        "GPipe: every microbatch's forward, then every backward",
        "colossal_jax.pipeline.schedule:gpipe_order",
    )
)
register(
    PipelineSchedule(
        "1f1b",
        "1F1B (PipeDream-Flush): warm-up forwards, then one forward and one backward in turn",
        "colossal_jax.pipeline.schedule:one_f_one_b_order",
    )
)
register(
    PipelineSchedule(
        "interleaved",
        "interleaved 1F1B: V model chunks per stage, a smaller bubble",
        "colossal_jax.pipeline.schedule:interleaved_order",
        virtual=True,
    )
)
