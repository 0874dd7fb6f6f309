"""Which of a pipeline chunk's ``vjp`` residuals are functions of its parameters alone.

A residual computed from the chunk's parameters only — a weight made varying over the mesh
axes the activations vary over (``pvary``, under a tensor or sequence split), a weight cast to
16 bits — is the same for every microbatch. Stored with the microbatch's residuals it costs a
copy of the stage's weights per microbatch in flight (under ``remat=none``, where no policy
drops such values). The executor (:mod:`colossal_jax.pipeline.executor`) recomputes these from
the stack in the backward pass instead, as it already takes the parameters themselves.

Method: the jaxpr of ``(params, inputs) -> residual leaves``, its constants (values captured
from the enclosing trace, such as the microbatch's positions) turned into inputs; a residual is
*parameter-only* when dead-code elimination of the jaxpr for that output alone uses no input
but parameters. The recompute is the jaxpr pruned to the parameter-only outputs, evaluated on
the parameters: the weights' casts once per backward, no matmul. Memory per device: one
parameter-shaped temporary per recomputed residual while the backward runs, against one per
microbatch in flight stored.

This reads JAX's internal dead-code elimination (``jax._src.interpreters.partial_eval``); where
that is missing, nothing is marked and every residual is stored as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

try:  # JAX internals: dead-code elimination of a jaxpr
    from jax._src.interpreters.partial_eval import convert_constvars_jaxpr, dce_jaxpr
except ImportError:  # pragma: no cover - a JAX without them stores every residual
    convert_constvars_jaxpr = dce_jaxpr = None


class ParamOnly:
    """``mask[i]``: residual ``i`` of ``fn(params, *inputs)`` depends on ``params`` alone;
    :meth:`recompute` gives those residuals (in order) from the parameters."""

    def __init__(self, fn: Callable[..., list], params: Any, *inputs: Any):
        n_out = len(jax.eval_shape(fn, params, *inputs))
        self.mask = [False] * n_out
        self._pruned = None
        if dce_jaxpr is None:
            return
        closed = jax.make_jaxpr(fn)(params, *inputs)
        jaxpr = convert_constvars_jaxpr(closed.jaxpr)  # constants first among the inputs
        n_const, n_param = len(closed.jaxpr.constvars), len(jax.tree.leaves(params))
        for i in range(n_out):
            _, used = dce_jaxpr(jaxpr, [j == i for j in range(n_out)])
            self.mask[i] = not any(used[:n_const]) and not any(used[n_const + n_param :])
        if any(self.mask):
            pruned, used = dce_jaxpr(jaxpr, self.mask)
            self._pruned = ClosedJaxpr(pruned, [])
            self._used = used[n_const : n_const + n_param]

    def recompute(self, params: Any) -> list[jax.Array]:
        if self._pruned is None:
            return []
        leaves = [p for p, u in zip(jax.tree.leaves(params), self._used, strict=True) if u]
        return list(jaxpr_as_fun(self._pruned)(*leaves))
