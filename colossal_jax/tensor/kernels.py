"""Per-device kernel bodies shared by the tensor-parallel modes (run *inside* ``jax.shard_map``).

Each mode composes these with its own axes; the collectives are explicit so their cost can be
read straight from the code (and from compiled HLO by :mod:`colossal_jax.analysis.hlo`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from colossal_jax.tensor.layout import AxisNames, in_per_stage_branches


def token_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x: [..., n]`` and ``w: [n, k]``, as one 2-D product ``[tokens, n] @ [n, k]``.

    The same arithmetic as ``einsum("bsn,nk->bsk")``; written over the flattened tokens, the
    backward pass's weight gradient is one ``x2ᵀ · dy2`` over the tokens, which XLA's CPU
    backend runs without first copying the output gradient into a transposed layout (the 3-D
    einsum's gradient does copy it): 12% off the default gpt2-tiny step on 8 simulated CPU
    devices (docs/performance.md). Communication: none. Memory: none beyond the product.
    """
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def lookup_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """``table[ids]`` (rows of ``table: [V, h]`` for integer ``ids`` of any shape) whose gradient
    adds up in float32.

    The gradient of a lookup is a scatter-add of the ``[..., h]`` output gradient into ``[V, h]``.
    On a 16-bit table (the bf16/fp16 compute copy of the parameters) XLA's GPU scatter adds in
    16 bits with compare-and-swap loops, serialised on every repeated token: 15.6 ms of each of
    gpt2-small's 63 ms bf16 steps (batch 16×1024, byte-level text) on an H200 went to that one
    fusion (docs/performance.md), and a frequent token's sum was rounded to bf16 at each of its
    hundreds of additions. Gathering from the table cast to float32 makes the transpose a
    float32 scatter (native atomic adds, one rounding at the end); the forward gathers from the
    float32 copy, a convert XLA can fuse into the gather. Communication: none. Memory: the
    ``[V, h]`` float32 gradient the scatter fills (the master gradient is float32 anyway).
    """
    if table.dtype in (jnp.bfloat16, jnp.float16):
        return jnp.take(table.astype(jnp.float32), ids, axis=0).astype(table.dtype)
    return jnp.take(table, ids, axis=0)


def varying_axes_of(x) -> frozenset[str]:
    """The mesh axes ``x`` (an array, a tracer or an abstract ``ShapeDtypeStruct``) varies over
    inside ``shard_map`` (jax 0.10: ``manual_axis_type``; other releases: ``vma``)."""
    t = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    if getattr(t, "vma", None) is not None:
        return frozenset(t.vma)
    if getattr(t, "manual_axis_type", None) is not None:
        return frozenset(t.manual_axis_type.varying)
    return frozenset()


_varying_axes = varying_axes_of


def varying(x: jax.Array, axes: AxisNames) -> jax.Array:
    """Mark ``x`` as varying over ``axes`` (those it is not already varying over).

    Used on a weight block *before* it is all-gathered: the transpose of this cast is the
    reduction of the weight gradient over ``axes`` (data, sequence, 2.5D depth), so it runs on the
    small local block instead of on the gathered one.
    """
    have = _varying_axes(x)
    todo = tuple(a for a in axes if a not in have)
    if not todo:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, todo, to="varying")
    return jax.lax.pvary(x, todo)  # the same cast under its earlier name


def grid_transpose(x: jax.Array, row: str, col: str) -> jax.Array:
    """On a ``q×q`` grid over ``(row, col)``, device ``(i, j)`` receives the block of device
    ``(j, i)`` (diagonal devices keep theirs): one ``ppermute`` of the block."""
    q = jax.lax.axis_size(row)
    perm = [(i * q + j, j * q + i) for i in range(q) for j in range(q)]
    return jax.lax.ppermute(x, (row, col), perm)


def split_layer_norm(
    x: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    eps: float,
    *,
    hidden_axes: AxisNames,
) -> jax.Array:
    """LayerNorm (Ba et al. 2016) of ``x: [b, s, h/n]`` whose hidden dimension is split over
    ``hidden_axes`` (n devices): the statistics Σx and Σx² are all-reduced over them, 2·b·s
    elements per device per direction; ``scale``/``bias`` are the local ``[h/n]`` slices."""
    xf = x.astype(jnp.float32)
    n_local = x.shape[-1]
    s1 = jnp.sum(xf, axis=-1, keepdims=True)
    s2 = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
    n = n_local
    if hidden_axes:
        s1, s2 = jax.lax.psum((s1, s2), hidden_axes)
        n = n_local * jax.lax.axis_size(hidden_axes)
    mean = s1 / n
    var = jnp.maximum(s2 / n - jnp.square(mean), 0.0)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale + bias).astype(x.dtype)


def split_rms_norm(
    x: jax.Array,
    scale: jax.Array,
    eps: float,
    *,
    hidden_axes: AxisNames,
) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467): ``x / sqrt(mean(x²) + eps) · scale``
    of ``x: [b, s, h/n]`` whose hidden dimension is split over ``hidden_axes`` (n devices). Only
    Σx² is all-reduced over them: ``b·s`` elements per device per direction, half of
    :func:`split_layer_norm`'s; no mean is subtracted and there is no bias. ``scale`` is the
    local ``[h/n]`` slice. Memory: the float32 copy of the block."""
    xf = x.astype(jnp.float32)
    s2 = jnp.sum(jnp.square(xf), axis=-1, keepdims=True)
    n = x.shape[-1]
    if hidden_axes:
        s2 = jax.lax.psum(s2, hidden_axes)
        n = n * jax.lax.axis_size(hidden_axes)
    y = xf * jax.lax.rsqrt(s2 / n + eps)
    return (y * scale).astype(x.dtype)


def vocab_parallel_embed(
    tokens: jax.Array,
    table: jax.Array,
    *,
    vocab_axes: AxisNames,
    scatter: bool,
) -> jax.Array:
    """Embedding lookup with the vocabulary split over ``vocab_axes`` (Megatron-LM).

    ``tokens: [B, s]`` hold global ids for the batch rows of every device in the vocab group;
    ``table: [V/n, h_local]`` is this device's contiguous vocabulary slice. Rows outside the slice
    contribute zero and the partial embeddings are combined over ``vocab_axes``: a reduce-scatter
    on the batch dimension when ``scatter`` (2D, 2.5D, 3D: the group also splits the batch), an
    all-reduce otherwise (1D). Communication: ``B·s·h_local·(n−1)/n`` (scatter) or twice that.
    """
    v_local = table.shape[0]
    if vocab_axes:
        local = tokens - jax.lax.axis_index(vocab_axes) * v_local
    else:
        local = tokens
    hit = (local >= 0) & (local < v_local)
    rows = lookup_rows(table, jnp.clip(local, 0, v_local - 1))
    rows = jnp.where(hit[..., None], rows, jnp.zeros((), rows.dtype))
    if not vocab_axes:
        return rows
    if scatter:
        return jax.lax.psum_scatter(rows, vocab_axes, scatter_dimension=0, tiled=True)
    return jax.lax.psum(rows, vocab_axes)


def reduce_loss(total: jax.Array, count: jax.Array, token_axes: AxisNames):
    """Sum the per-device loss sums over every axis that splits the tokens (replicated result)."""
    if token_axes:
        total, count = jax.lax.psum((total, count), token_axes)
    return total, count


def ring_shift(x, axis_name: str, p: int):
    """Send every block one hop along the ring: device j -> j + 1 (mod p).

    A ``ppermute`` (``x`` bytes per device), except inside a pipeline stage's branch
    (:func:`colossal_jax.tensor.layout.in_per_stage_branches`): XLA's CPU runtime
    makes a collective-permute wait for *every* device of the program, so one inside a per-stage
    branch would wait for stages running another branch. There the hop is an all-to-all whose
    only non-empty block goes to the next device: the same bytes at ``p = 2``, ``p − 1`` times
    the ring's at larger ``p``.
    """
    if in_per_stage_branches():
        return jax.tree.map(lambda a: _shift_by_all_to_all(a, axis_name, p), x)
    return jax.lax.ppermute(x, axis_name, perm=[(j, (j + 1) % p) for j in range(p)])


def _shift_by_all_to_all(x: jax.Array, axis_name: str, p: int) -> jax.Array:
    j = jax.lax.axis_index(axis_name)
    slots = jnp.zeros((p, *x.shape), x.dtype)
    slots = jax.lax.dynamic_update_index_in_dim(slots, x, (j + 1) % p, 0)
    received = jax.lax.all_to_all(slots, axis_name, 0, 0)  # received[i] = device i's slot j
    return jax.lax.dynamic_index_in_dim(received, (j - 1) % p, 0, keepdims=False)
