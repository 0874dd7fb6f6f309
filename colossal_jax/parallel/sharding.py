"""From a :class:`ParallelConfig` to the layout that splits the model, and the shardings of
parameters (by their role) and of optimizer state (with ZeRO).

Every parameter created by the library's layers carries a ``role`` (``weight_in``,
``weight_out``, ``bias_in``, ``bias_out``, ``norm``, ``embedding``, ``weight_features``,
``bias_features``); the active layout maps each
role to a ``PartitionSpec``. Optimizer-state leaves that mirror a parameter (Adam moments, momenta)
keep that role, so they get the same spec — plus ``data`` under ZeRO-1.

Parameters of the layer stack also carry ``layer_axis`` (their leading dimension indexes layers):
one rule, here, prepends that dimension's entry for every tensor mode — ``None`` (unsplit)
without a pipeline, ``pipe`` with one. A spec whose rank differs from its array's is an error,
never a silent reshard.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from colossal_jax.config import ParallelConfig, seq_modes
from colossal_jax.config.seq_modes import seq_mode
from colossal_jax.config.tensor_modes import tensor_mode
from colossal_jax.layers.stack import LAYER_AXIS
from colossal_jax.tensor.layout import ActivationAxes, LocalAttention, TensorLayout


def make_layout(cfg: ParallelConfig, mesh: Mesh) -> TensorLayout:
    """The layout of the registered tensor mode ``cfg.tensor_mode`` on ``mesh``
    (:mod:`colossal_jax.config.tensor_modes`), with collective matmuls when
    ``cfg.collective_matmul`` (a mode that splits the model takes the flag)."""
    act = ActivationAxes(batch=("data",), seq="seq")
    mode = tensor_mode(cfg.tensor_mode)
    layout = mode.layout_class()
    if mode.splits_tensor:
        return layout(mesh, act, collective_matmul=cfg.collective_matmul)
    return layout(mesh, act)


def make_local_attention(cfg: ParallelConfig, *, implementation: str = "auto") -> LocalAttention:
    """The per-device attention kernel of the registered sequence mode ``cfg.seq_mode``
    (:mod:`colossal_jax.config.seq_modes`), run inside the layout's shard_map; with ``seq=1``,
    the kernel without a sequence split whatever the mode. The mask is not the mode's: each
    attention layer passes its own ``causal`` (and padding travels as negative positions),
    :data:`colossal_jax.tensor.layout.LocalAttention`.

    ``implementation`` (``auto | xla | cudnn | blockwise``) chooses the block kernel where
    token order is position order (no sequence split, Ulysses): ``auto`` is cuDNN flash
    attention on a GPU in bf16/fp16 and the XLA reference otherwise, ``blockwise`` the
    plain-JAX flash-style kernel (:mod:`colossal_jax.sequence.fused`).
    """
    mode = seq_mode(cfg.seq_mode) if cfg.seq > 1 else seq_modes.LOCAL
    options: dict[str, str] = {}
    if mode.splits_sequence:
        options["axis_name"] = "seq"
    if mode.position_order:
        options["implementation"] = implementation
    return functools.partial(mode.kernel_function(), **options)


def role_spec(layout: TensorLayout, role: str) -> P:
    """The PartitionSpec of a parameter with ``role`` under ``layout``."""
    if role in ("weight_in", "weight_out"):
        return layout.weight_spec(role.removeprefix("weight_"))  # type: ignore[arg-type]
    if role in ("bias_in", "bias_out"):
        return layout.bias_spec(role.removeprefix("bias_"))  # type: ignore[arg-type]
    if role == "norm":
        return layout.norm_spec()
    if role == "embedding":
        return layout.embedding_spec()
    if role in ("weight_features", "bias_features"):
        from colossal_jax.tensor import features

        return (
            features.weight_spec(layout)
            if role == "weight_features"
            else features.bias_spec(layout)
        )
    raise ValueError(f"parameter role {role!r} has no sharding rule")


def _axes_of(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def zero_spec(
    spec: P, shape: tuple[int, ...], mesh: Mesh, axis: str = "data", *, skip: int = 0
) -> P:
    """Add ``axis`` to the first dimension of ``spec`` (from ``skip`` on) that still divides by it
    (ZeRO, Rajbhandari et al. 2020). A tensor with no such dimension stays as it is (replicated
    over ``axis``). Stacked parameters skip their layer dimension, so each layer's slice is
    sharded the same way whatever the depth."""
    n = mesh.shape[axis]
    entries = list(spec) + [None] * (len(shape) - len(spec))
    if n == 1 or any(axis in _axes_of(e) for e in entries):
        return P(*entries)
    for dim, entry in enumerate(entries):
        if dim < skip:
            continue
        axes = _axes_of(entry)
        split = 1
        for a in axes:
            split *= mesh.shape[a]
        if shape[dim] % (split * n) == 0:
            new = (*axes, axis)
            entries[dim] = new[0] if len(new) == 1 else new
            return P(*entries)
    return P(*entries)


def is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def variable_spec(
    variable: nnx.Variable, layout: TensorLayout, *, layer_entry: str | None = None
) -> P:
    """The spec of one parameter (or optimizer-state mirror of one): its role's spec, with the
    layer dimension's entry prepended for stacked parameters. Raises ``ValueError`` when the
    spec's rank differs from the array's."""
    meta = variable.get_metadata()
    role = meta.get("role")
    shape = tuple(variable.get_value().shape)
    if role is None:
        return P()
    spec = role_spec(layout, role)
    if meta.get(LAYER_AXIS) is not None:
        spec = P(layer_entry, *spec)
    if len(spec) != len(shape):
        raise ValueError(
            f"a {role} parameter of shape {shape} got the {len(spec)}-dimensional spec {spec} "
            f"under {layout.mode}; stacked parameters need layer_axis metadata"
        )
    return spec


def tree_shardings(
    tree,
    layout: TensorLayout,
    *,
    zero_axis: str | None = None,
    layer_entry: str | None = None,
    rest_axis: str | None = None,
) -> object:
    """A NamedSharding for every leaf of ``tree`` (an nnx State, or an optimizer state holding
    nnx Variables). Variables get their role's spec (+ ZeRO ``zero_axis``; stacked parameters
    get ``layer_entry`` — ``None`` or ``"pipe"`` — on their layer dimension; the unstacked ones
    — embedding, final norm, head — are also split over ``rest_axis`` where a dimension divides,
    as a pipeline stores them: :func:`rest_axis_dims`); other leaves (step counters, scalars)
    are replicated."""
    mesh = layout.mesh

    def one(leaf):
        if is_variable(leaf):
            spec = variable_spec(leaf, layout, layer_entry=layer_entry)
            meta, shape = leaf.get_metadata(), tuple(leaf.get_value().shape)
            if meta.get("role") is not None:
                stacked = meta.get(LAYER_AXIS) is not None
                if zero_axis is not None:
                    spec = zero_spec(spec, shape, mesh, zero_axis, skip=1 if stacked else 0)
                if rest_axis is not None and not stacked:
                    spec = zero_spec(spec, shape, mesh, rest_axis)
            return NamedSharding(mesh, spec)
        return NamedSharding(mesh, P())

    return jax.tree.map(one, tree, is_leaf=is_variable)


def param_specs(
    state,
    layout: TensorLayout,
    *,
    layer_entry: str | None = None,
    zero_axis: str | None = None,
    rest_axis: str | None = None,
):
    """PartitionSpecs (not shardings) of an nnx State under ``layout`` (+ ZeRO ``zero_axis``,
    + ``rest_axis`` on the unstacked parameters: :func:`tree_shardings`)."""
    return jax.tree.map(
        lambda s: s.spec,
        tree_shardings(
            state, layout, layer_entry=layer_entry, zero_axis=zero_axis, rest_axis=rest_axis
        ),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def rest_axis_dims(specs, axis: str):
    """For each PartitionSpec of ``specs``, the dimension ``axis`` splits (None: not split)."""

    def one(spec):
        return next((d for d, entry in enumerate(spec) if axis in _axes_of(entry)), None)

    return jax.tree.map(one, specs, is_leaf=lambda x: isinstance(x, P))


ShardingFn = Callable[[object], object]
