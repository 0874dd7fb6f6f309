"""ZeRO stages 1–3 over the ``data`` axis (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", arXiv 1910.02054).

Design: ``data`` is not a gradient axis of any kernel. The step runs in one ``jax.shard_map`` in
which every mesh axis is manual (:mod:`colossal_jax.parallel.step`); on entry every parameter is
cast to
*varying* over ``data`` (:func:`enter`), so the kernels' own weight-gradient reductions cover only
their tensor and sequence axes and each device's gradient is its batch shard's partial sum. One
place, :func:`reduce`, then owns the reduction over ``data``, per stage:

- stage 0/1: ``psum`` (all-reduce, ``2(N−1)/N·Ψ`` elements per device); stage 1 shards only the
  optimizer state (by the sharding of ``opt_state``; the update runs on shards and the new
  parameters are all-gathered by the compiler);
- stage 2: ``psum_scatter`` (reduce-scatter, ``(N−1)/N·Ψ``): each device keeps ``Ψ/N`` of the
  gradient, the optimizer updates that shard, and the parameters are all-gathered after the
  update (``(N−1)/N·Ψ``): the same volume as stage 0's all-reduce;
- stage 3: parameters are *stored* as ``Ψ/N`` shards. Each layer's weights are all-gathered inside
  the scanned stack just before the layer runs (:func:`gather_layer`, installed as the stack's
  ``prepare_layer`` hook) and dropped after it; the backward pass gathers them again (the layer is
  rematerialised) and the gather's transpose is the reduce-scatter of that layer's gradient, so
  only one layer's full weights (and gradient) is alive at a time. Volume ``3(N−1)/N·Ψ`` per step
  (two all-gathers, one reduce-scatter): 1.5× stage 0. The embedding, final norm and head (not
  stacked) are gathered whole at the start.

The dimension sharded over ``data`` is the one :func:`colossal_jax.parallel.sharding.zero_spec`
picks (the
first that divides after the tensor split; never the layer dimension); a parameter with no such
dimension stays replicated (:func:`leftovers` lists them) and is all-reduced as in stage 0.

Why this design rather than teaching every kernel the stage: the kernels keep one job (tensor and
sequence parallelism), the stage is one argument of three small functions here, and the same
functions serve the pipeline, gradient accumulation and every tensor mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from colossal_jax.layers.stack import StackOptions, is_stacked
from colossal_jax.parallel.sharding import _axes_of, is_variable, variable_spec, zero_spec
from colossal_jax.tensor.kernels import varying
from colossal_jax.tensor.layout import TensorLayout

AXIS = "data"
ZERO_STAGES = (0, 1, 2, 3)
GATHERED = "zero3_gathered"
GATHERED_NAMES = (GATHERED,)
"""``checkpoint_name`` of a gathered ZeRO-3 weight: never saved for the backward pass."""


def zero_dim(
    variable: nnx.Variable, layout: TensorLayout, *, layer_entry: str | None
) -> int | None:
    """The dimension of ``variable`` that ZeRO shards over ``data`` (``None``: it stays
    replicated, because no dimension divides or ``data`` is 1)."""
    if variable.get_metadata().get("role") is None:
        return None
    spec = variable_spec(variable, layout, layer_entry=layer_entry)
    shape = tuple(variable.get_value().shape)
    skip = 1 if is_stacked(variable) else 0
    zspec = zero_spec(spec, shape, layout.mesh, AXIS, skip=skip)
    entries = list(spec) + [None] * (len(shape) - len(spec))
    for dim, (before, after) in enumerate(zip(entries, zspec, strict=True)):
        if AXIS in _axes_of(after) and AXIS not in _axes_of(before):
            return dim
    return None


def zero_dims(tree: Any, layout: TensorLayout, *, layer_entry: str | None = None) -> Any:
    """:func:`zero_dim` of every Variable of ``tree`` (an nnx State), as a tree of the same
    structure (``None`` for leaves that are not parameters)."""
    return jax.tree.map(
        lambda v: zero_dim(v, layout, layer_entry=layer_entry) if is_variable(v) else None,
        tree,
        is_leaf=is_variable,
    )


def leftovers(tree: Any, layout: TensorLayout, *, layer_entry: str | None = None) -> list[str]:
    """Paths of the parameters that ZeRO leaves replicated over ``data`` (no dimension divides)."""
    if layout.mesh.shape.get(AXIS, 1) == 1:
        return []
    out = []
    for path, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]:
        if is_variable(v) and zero_dim(v, layout, layer_entry=layer_entry) is None:
            out.append("/".join(str(getattr(k, "key", k)) for k in path))
    return out


def map_dims(f, tree: Any, dims: Any, extra: Any = None) -> Any:
    """``f(leaf, dim, stacked)`` over the Variables of ``tree`` with their dims (ZeRO's, or the
    one ``pipe`` splits: :mod:`colossal_jax.pipeline.step`); with
    ``extra`` (a tree of axis tuples), ``f(leaf, dim, stacked, axes)``."""

    def one(v, d, ax=None):
        if not is_variable(v):
            return v
        args = (v.get_value(), d, is_stacked(v))
        return v.replace(f(*args) if extra is None else f(*args, tuple(ax or ())))

    if extra is None:
        return jax.tree.map(one, tree, dims, is_leaf=is_variable)
    return jax.tree.map(one, tree, dims, extra, is_leaf=is_variable)


def extra_axes(specs: Any, token_axes: tuple[str, ...]) -> Any:
    """For each parameter (``specs``: its PartitionSpec tree), the axes other than ``data`` that
    split the tokens but not the parameter: its gradient is a partial sum over them."""
    from jax.sharding import PartitionSpec

    def one(spec):
        held = set(_axes_of_spec(spec))
        return tuple(a for a in token_axes if a != AXIS and a not in held)

    return jax.tree.map(one, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _axes_of_spec(spec) -> list[str]:
    return [a for entry in spec for a in _axes_of(entry)]


def enter(params: Any, dims: Any, stage: int, extra: Any = None) -> Any:
    """Inside the all-manual step: cast every parameter varying over ``data`` so no kernel
    reduces its gradient over ``data`` (stage 3's sharded leaves already vary over it).

    ``extra`` (a tree of axis-name tuples, one per parameter; see :func:`extra_axes`) names the
    other axes that split the tokens but not the parameter (``seq``, a tensor mode's batch axes):
    the parameter is cast varying over them too, once per array, so no layer casts it at each
    use — a cast inside the scanned stack would reduce its gradient in every layer and make the
    scan keep a copy of every layer's weights for the backward pass — and :func:`reduce` sums
    the gradient over them with the sum over ``data``, in one collective."""

    def one(a, d, _, ax=()):
        if not (stage == 3 and d is not None):
            a = varying(a, (AXIS,))
        return varying(a, ax)

    return map_dims(one, params, dims, extra)


def gather(a: jax.Array, dim: int) -> jax.Array:
    """All-gather a ZeRO-3 shard over ``data`` along ``dim`` (transpose: reduce-scatter)."""
    return checkpoint_name(jax.lax.all_gather(a, AXIS, axis=dim, tiled=True), GATHERED)


def gather_rest(params: Any, dims: Any) -> Any:
    """Stage 3: the whole unstacked parameters (embedding, norms, head) from their shards."""
    return map_dims(
        lambda a, d, stacked: a if (d is None or stacked) else gather(a, d), params, dims
    )


def gather_layer(layer_dims: list[int | None]):
    """Stage 3's ``prepare_layer`` hook: gather one layer's weights (``layer_dims``: each stacked
    leaf's ZeRO dimension, in the flattening order of the stack's layer state)."""

    def prepare(layer_state: Any) -> Any:
        leaves, treedef = jax.tree.flatten(layer_state)
        if len(leaves) != len(layer_dims):
            raise ValueError(
                f"ZeRO-3: a layer has {len(leaves)} parameters but {len(layer_dims)} dims"
            )
        leaves = [
            a if d is None else gather(a, d - 1) for a, d in zip(leaves, layer_dims, strict=True)
        ]
        return jax.tree.unflatten(treedef, leaves)

    return prepare


def stack_options(
    stage: int, layer_dims: list | None, remat: Callable[..., bool] | None
) -> StackOptions:
    """How the stack runs under ``stage``: the ``remat`` policy, and for stage 3 the per-layer
    gather, whose gathered weights are never kept for the backward pass (without a remat policy
    the layer is rematerialised saving everything else: :func:`keep_all_but_gathered`)."""
    if stage != 3:
        return StackOptions(remat=remat)
    if layer_dims is None:
        raise ValueError("ZeRO-3 needs the stack's layer dims (step.stack_layer_dims)")
    keep = remat if remat is not None else keep_all_but_gathered
    return StackOptions(remat=keep, prepare_layer=gather_layer(layer_dims))


def keep_all_but_gathered(prim: Any, *_: Any, **params: Any) -> bool:
    """Stage 3's ``jax.checkpoint`` policy under ``--remat none``: every value is saveable for
    the backward pass except a gathered weight, which the backward gathers again from its shard.

    ``save_anything_except_these_names(GATHERED)`` alone is not enough: it refuses the named
    value but saves the ``all_gather``'s own output, from which the named one is recomputed
    for free, so every layer's whole weights stayed alive until its backward (the 4-layer,
    256-wide GPT at ``data=8``: 11.5 MiB more temporaries, the fp32 stack). Refusing the
    gather over ``data`` too keeps one layer's gathered weights at a time, at the price of the
    second gather that every other remat policy already pays (3 × the weights over ``data`` a
    step: two gathers and the gradient's reduce-scatter).
    """
    if prim.name == "name":
        return params["name"] not in GATHERED_NAMES
    if prim.name == "all_gather":
        axes = params.get("axis_name", ())
        return AXIS not in (axes if isinstance(axes, tuple) else (axes,))
    return True


def reduce(grads: Any, dims: Any, stage: int, extra: Any = None) -> Any:
    """The one reduction of the gradients over ``data``: all-reduce (stages 0–1, and leftovers),
    reduce-scatter along the ZeRO dim (stage 2); stage 3's sharded leaves were reduce-scattered
    by the transpose of their gathers and pass through. With ``extra`` (:func:`enter`) each
    gradient is also summed over its extra axes: in the same all-reduce for stages 0–1."""

    def one(g, d, _, ax=()):
        if d is None or stage <= 1:
            return jax.lax.psum(g, (AXIS, *ax))
        if ax:
            g = jax.lax.psum(g, ax)
        if stage == 2:
            return jax.lax.psum_scatter(g, AXIS, scatter_dimension=d, tiled=True)
        return g

    return map_dims(one, grads, dims, extra)
