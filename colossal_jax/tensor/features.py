"""Per-token input features into the residual stream: ``x @ W + b`` in any layout.

Token ids enter a model through an embedding table; continuous inputs (a ViT's image patches)
enter through a linear map of per-token feature vectors. The features arrive like token ids, in
the layout's :meth:`~colossal_jax.tensor.layout.TensorLayout.token_spec` with a whole trailing
feature dimension ``F``, and must leave in the residual stream's spec ``[b, s, h]``.

Algorithm (derived from the layout's specs, so it is the same in every mode; the input side of
a column-parallel linear, Shoeybi et al. 2019, with the columns split as the residual's hidden
dimension rather than the wide one): the weight ``[F, h]`` is split like the residual's hidden
dimension and replicated over the rest
(:func:`weight_spec`), the bias like the residual's hidden dimension; each device multiplies the
feature rows of its residual batch block by its weight columns — the output block is the
residual's, with no collective in the forward pass. The weight's gradient is summed over the
axes that split the tokens but not the weight (the data axis is left to the caller's ZeRO
reduction, as for every weight). Where the tokens' batch split differs from the residual's
(3D: ``(b, i, k)`` vs ``(b, i, j)``), the feature rows are first all-gathered over the axes
beyond the common prefix and the residual's block is sliced out.

Communication per device: none in 1D, 2D and 2.5D forward; in 3D an all-gather of the feature
block, ``(q−1)·b_local·s·F`` elements; backward, the weight gradient's all-reduce over those
token axes, ``F·h_local`` elements. Memory: the ``[F, h_local]`` weight block and, in 3D, the
``q``-times larger gathered feature block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.kernels import varying
from colossal_jax.tensor.layout import TensorLayout, in_manual_region, sharded


def _axes(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def weight_spec(layout: TensorLayout) -> P:
    """``[F, h]``: features whole, hidden split as the residual's."""
    return P(None, layout.residual_spec()[2])


def bias_spec(layout: TensorLayout) -> P:
    """``[h]``: split as the residual's hidden dimension."""
    return P(layout.residual_spec()[2])


def _to_residual_batch(layout: TensorLayout, x: jax.Array) -> jax.Array:
    """Per device: the token-spec block ``x`` re-cut to the residual spec's batch block."""
    held = _axes(layout.token_spec()[0])
    want = _axes(layout.residual_spec()[0])
    common = 0
    while common < min(len(held), len(want)) and held[common] == want[common]:
        common += 1
    if held[common:]:
        x = jax.lax.all_gather(x, held[common:], axis=0, tiled=True)
    if want[common:]:
        size = x.shape[0] // layout.axis_size(want[common:])
        start = jax.lax.axis_index(want[common:]) * size
        x = jax.lax.dynamic_slice_in_dim(x, start, size, axis=0)
    return x


def embed_features(
    layout: TensorLayout, x: jax.Array, w: jax.Array, b: jax.Array | None
) -> jax.Array:
    """``x @ w + b`` for token-layout features ``x: [b, s, F]`` into the residual ``[b, s, h]``
    (see the module docstring); ``w`` in :func:`weight_spec`, ``b`` in :func:`bias_spec`."""
    residual = layout.residual_spec()
    w_axes = {a for entry in weight_spec(layout) for a in _axes(entry)}
    token_axes = [a for entry in residual[:2] for a in _axes(entry)]
    grad_axes = tuple(a for a in token_axes if a not in w_axes)

    def body(x, w, *bias):
        y = jnp.einsum("bsf,fh->bsh", x.astype(w.dtype), varying(w, grad_axes))
        return y + bias[0] if bias else y

    in_spec = P(residual[0], residual[1], None)
    if in_manual_region():
        x = _to_residual_batch(layout, x)
    specs = (in_spec, weight_spec(layout)) + ((bias_spec(layout),) if b is not None else ())
    args = (x, w) + ((b,) if b is not None else ())
    return sharded(body, layout.mesh, specs, residual)(*args)


__all__ = ["bias_spec", "embed_features", "weight_spec"]
