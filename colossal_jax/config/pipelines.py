"""The pipeline schedules, one registered :class:`PipelineSchedule` each: its name and help, the
function that orders each stage's operations, and the properties the rules read.

The built-in schedules — ``none`` (no pipeline), ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``
and ``zb-v`` — are
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
      chunks: it runs exactly this many model chunks per stage (``--virtual-stages`` must say
        so; ZB-V: 2), or None.
      placement: where model chunk ``c`` lives: ``"loop"`` (stage ``c mod p``) or ``"v"`` (two
        chunks per stage, stage ``s`` holding ``s`` and ``2p − 1 − s``;
        :func:`colossal_jax.pipeline.schedule.place`).
      split_backward: its backward runs as B (activation gradient) and W (weight gradient)
        operations (zero-bubble schedules).
    """

    name: str
    help: str
    order: Reference | None
    virtual: bool = False
    chunks: int | None = None
    placement: str = "loop"
    split_backward: bool = False

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
register(
    PipelineSchedule(
        "zb-h1",
        "ZB-H1 (zero bubble): 1F1B's memory, the backward split into B and W, W in the bubbles",
        "colossal_jax.pipeline.zero_bubble:zb_h1_order",
        split_backward=True,
    )
)
register(
    PipelineSchedule(
        "zb-v",
        "ZB-V (zero bubble): 2 chunks per stage in a V, B/W split; needs --virtual-stages 2",
        "colossal_jax.pipeline.zero_bubble:zb_v_order",
        chunks=2,
        placement="v",
        split_backward=True,
    )
)
