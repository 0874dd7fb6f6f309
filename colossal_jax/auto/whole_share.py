"""The share of a layer's kept values that 1D tensor parallelism leaves whole on every device,
per model family and remat policy, read off the family's own code: one layer traced per device
on a 2-way 1D split and on one device (:func:`whole_share`).

1D (Megatron-LM, :mod:`colossal_jax.tensor.one_d`) splits an ``"in"`` linear's output over the
tensor group and leaves the residual stream, a row-parallel linear's all-reduced output and the
norms' statistics whole. Which of a layer's kept values are which depends on the family and the
policy: under ``selective`` the GPT keeps the layer input and the attention's output projection
whole (2 of its 9 ``h``-wide units), BERT's post-LayerNorm block the MLP's down projection as
well (3 of 10), since its second norm's backward needs that output; under ``dots`` the
attention's ``[s, a, d]`` value product joins the split ones. A trace of the layer as the step
runs it, inside the ``shard_map`` over the mesh (:mod:`colossal_jax.parallel.step`), sees each
residual's per-device shape, so the share is exact: with ``o₁`` the kept elements per token on
one device and ``o₂`` on each of two, ``o₂ = o₁·(w + (1 − w)/2)``, so ``w = 2·o₂/o₁ − 1``.
Nothing is compiled or allocated; the figure is kept on disk beside the layer's others
(:class:`colossal_jax.auto.cache.Cache`, kind ``layer``)."""

from __future__ import annotations

import functools
from typing import Any

from colossal_jax.auto.layer_memory import (
    TRACE_LEN,
    cached_trace,
    figure_key,
    kept,
    layer_residuals,
    trace_inputs,
)

SPLIT = 2
"""The 1D split :func:`whole_share` traces the layer under (any split gives the same share)."""


@functools.lru_cache(maxsize=256)
def whole_share(model: Any, remat: str) -> float | None:
    """The share ``w`` of one layer's kept non-score elements per token
    (:attr:`colossal_jax.auto.layer_memory.Kept.other`) that 1D leaves whole on every device
    under ``remat`` (module docstring): 0.26 / 0.20 / 0.22 for the 4-layer, 256-wide GPT under
    ``none`` / ``dots`` / ``selective``, 0.26 / 0.27 / 0.30 for BERT, 1 under ``full``; None
    when the layer keeps nothing per token or this process has a single CPU device. Read from
    the disk cache when it holds it."""
    whole = kept(model, remat).other
    if whole <= 0:
        return None

    def traced() -> float:
        ratio = _split_other(model, remat) / whole  # o_t / o_1 = w + (1 - w) / t
        return min(1.0, max(0.0, (SPLIT * ratio - 1) / (SPLIT - 1)))

    key = figure_key(model, TRACE_LEN, f"whole1d/{remat}")
    meta = {"model": repr(model), "kind": "whole1d", "remat": remat}
    return cached_trace(key, "share", SPLIT, meta, traced)


def _split_other(model: Any, remat: str) -> float:
    """Kept elements per token with one token dimension (as
    :attr:`~colossal_jax.auto.layer_memory.Kept.other` counts them) on one device of a
    :data:`SPLIT`-way 1D split: ``jax.vjp``'s saved residuals of one layer of the scanned stack,
    traced inside the step's ``shard_map`` over the mesh, where their shapes are per device."""
    import jax
    from jax._src.ad_checkpoint import saved_residuals
    from jax.sharding import PartitionSpec as P

    from colossal_jax.auto.layer_memory import stack_fn
    from colossal_jax.config import ParallelConfig
    from colossal_jax.layers.context import use_parallelism
    from colossal_jax.parallel.mesh import build_mesh
    from colossal_jax.parallel.sharding import make_layout, make_local_attention, param_specs

    cfg = ParallelConfig(tensor_row=SPLIT, tensor_mode="1d")
    mesh = build_mesh(cfg, jax.devices("cpu")[:SPLIT])
    layout, attention = make_layout(cfg, mesh), make_local_attention(cfg)
    f, params = stack_fn(model, 1, remat)
    residuals: list[tuple[Any, str]] = []

    def per_device(p: Any, x: Any, positions: Any) -> Any:
        with use_parallelism(layout, attention):
            residuals.extend(saved_residuals(f, p, x, positions))
            return f(p, x, positions)

    # the stack's parameters split as a step splits them; the rest (embeddings, head), which the
    # stack does not read, replicated (a vocabulary need not divide by the split)
    def stack_only(path: tuple[Any, ...], spec: P) -> P:
        return spec if getattr(path[0], "key", None) == "blocks" else P()

    split = jax.tree_util.tree_map_with_path(
        stack_only, param_specs(params, layout), is_leaf=lambda x: isinstance(x, P)
    )
    specs = (split, layout.residual_spec(), layout.token_spec())
    step = jax.shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)
    jax.make_jaxpr(step)(params, *trace_inputs(model))  # a trace: nothing compiled
    return sum(size / TRACE_LEN for _, size, tokens in layer_residuals(residuals) if tokens == 1)
