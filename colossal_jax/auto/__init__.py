"""The automatic planner: search mesh, modes, pipeline, ZeRO, remat and offload together.

:mod:`~colossal_jax.auto.space` enumerates the candidates (each a :class:`Plan` from
:func:`colossal_jax.checks.resolve.resolve`), :mod:`~colossal_jax.auto.hardware` models the
devices, :mod:`~colossal_jax.auto.cost` predicts each candidate's step time and memory, and
:mod:`~colossal_jax.auto.search` ranks them under a memory budget (``scripts/plan.py``,
``scripts/train.py --mesh auto``, :func:`~colossal_jax.auto.search.auto_plan`). docs/planner.md
describes the method.
"""
