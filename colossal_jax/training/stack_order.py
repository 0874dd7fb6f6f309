"""Where a run's stacked parameters live between steps: model order, or chunk order.

A pipeline with ``V > 1`` chunks per stage (interleaved 1F1B, ZB-V) runs model chunk ``c`` on a
stage that, in model order, does not hold it. Such a run keeps its parameters and optimizer
state **in chunk order** between steps — each stage's contiguous block of the layer axis holds
the chunks it runs — so its train step moves no parameter and no gradient between stages
(:mod:`colossal_jax.pipeline.chunk_order`). Everything outside the loop sees model order:
:func:`~colossal_jax.training.run.init_state` and :func:`~colossal_jax.training.run.restore`
return it, checkpoints hold it (a run resumes under any other pipeline or mesh), the trained
state handed back is in it.

:func:`to_stored` and :func:`to_model` move a state across that boundary: one ``ppermute``
exchange per direction, the arrays donated, the parameters and the optimizer state in separate
programs (the transient copy is at most the larger of the two). Runs with ``V = 1`` store model
order and both are the identity.
"""

from __future__ import annotations

from typing import Any

import jax

from colossal_jax.pipeline.chunk_order import exchange_stacked
from colossal_jax.training.run import Run


def chunk_ordered(run: Run) -> bool:
    """Whether ``run`` keeps its stack in chunk order between steps."""
    return run.schedule is not None and run.schedule.virtual_stages > 1


def to_stored(run: Run, params: Any, opt_state: Any) -> tuple[Any, Any]:
    """A model-order state as ``run`` stores it between steps (``params`` and ``opt_state``
    are donated when they move)."""
    return _move(run, params, opt_state, to_chunks=True)


def to_model(run: Run, params: Any, opt_state: Any = None) -> tuple[Any, Any]:
    """A stored state back in model order (donated when it moves); ``opt_state`` may be None."""
    return _move(run, params, opt_state, to_chunks=False)


def _move(run: Run, params: Any, opt_state: Any, *, to_chunks: bool) -> tuple[Any, Any]:
    if not chunk_ordered(run):
        return params, opt_state
    params = _program(run, "params", to_chunks)(params)
    if opt_state is not None:
        opt_state = _program(run, "opt", to_chunks)(opt_state)
    return params, opt_state


def _program(run: Run, part: str, to_chunks: bool):
    """The jitted exchange of one part of the state (cached on the run)."""
    key = (part, to_chunks)
    cache = run.__dict__.setdefault("_stack_order_programs", {})
    if key not in cache:
        where = run.param_shardings if part == "params" else run.opt_shardings
        compute = run.device_param_shardings if part == "params" else run.device_opt_shardings

        def move(tree):
            return exchange_stacked(
                tree, where, run.schedule, to_chunks=to_chunks, device_shardings=compute
            )

        cache[key] = jax.jit(move, in_shardings=(where,), out_shardings=where, donate_argnums=0)
    return cache[key]
