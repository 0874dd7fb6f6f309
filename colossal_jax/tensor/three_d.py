"""Mode ``3d``: 3D tensor parallelism on a q×q×q cube (Bian et al. 2021, arXiv 2105.14450).

Axes ``i = tensor_row``, ``j = tensor_col``, ``k = tensor_depth``; p = q³. Activations, weights
and outputs are each split into q³ blocks. Two activation layouts alternate:

- layout A (the residual stream): ``X[(b, i, j), s, (k)]`` — batch over ``i`` then ``j``,
  hidden over ``k``;
- layout B (the wide activations: QKV, MLP hidden, logits): ``Y[(b, i, k), s, (j)]``.

An ``"in"`` linear maps A → B with ``W[(k, i), j]``: all-gather ``X`` over ``j`` (batch) and
``W`` over ``i`` (rows), multiply, reduce-scatter the partial sums over ``k`` (batch). An
``"out"`` linear maps B → A with ``W[(j, i), k]``, the same algorithm with ``j`` and ``k``
swapped — consecutive layers swap the roles of the input and output axes, so layouts chain with
no extra movement and no device ever holds a full ``[tokens, hidden]`` activation.

Communication per device, one linear ``[M, N] @ [N, K]`` forward + backward:
``2·(q−1)/q³·(M·N + N·K + M·K)`` elements. Memory per device: weights ``N·K/q³``, activations
``M·N/q³``, transient gathered blocks ``M·N/q²`` and ``N·K/q²`` and the partial product
``M·K/q²``. Layer norm all-reduces its statistics over ``k``.

Collective matmul (``--collective-matmul on``; Wang et al. 2023, ASPLOS): the input gather and
the output reduce-scatter run over different axes (``j`` and ``k``) with different block orders,
so one of them is decomposed — the larger, compared by width (both act on ``M/q`` rows): for
``K ≥ N`` (QKV, MLP up, LM head) the reduce-scatter, as a ring over the scatter axis whose step
``s`` computes the partial product of the batch block in flight and adds it to the accumulator
passed on; otherwise (MLP down) the input gather, as a ring over the gather axis whose step
computes the product of the batch block it holds. ``W`` is all-gathered over ``i`` as before.
Same elements per device; the algorithm's transient partial product falls from ``M·K/q²`` to
two ``M·K/q³`` blocks (reduce-scatter ring), or the gathered input from ``M·N/q²`` to two blocks
(gather ring; autodiff keeps the ``q`` blocks for the backward pass). The backward pass of
each ring is its transpose, the other ring in reverse, again one partial matmul per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.collective_matmul import block, ring_all_gather, ring_reduce_scatter
from colossal_jax.tensor.grid import GridLayout
from colossal_jax.tensor.kernels import grid_transpose, token_matmul, varying
from colossal_jax.tensor.layout import (
    LinearKind,
    in_per_stage_branches,
    sharded,
    spec_axes,
)


class ThreeDLayout(GridLayout):
    mode = "3d"
    i = "tensor_row"
    j = "tensor_col"
    k = "tensor_depth"

    @property
    def q(self) -> int:
        return self.axis_size(self.i)

    def _a_batch(self) -> tuple[str, ...]:
        return (*self.act.batch, self.i, self.j)

    def _b_batch(self) -> tuple[str, ...]:
        return (*self.act.batch, self.i, self.k)

    def batch_divisor(self) -> int:
        return self.axis_size(self.act.batch) * self.q * self.q

    # ---- specs -------------------------------------------------------------------------------
    def residual_spec(self) -> P:
        return P(spec_axes(*self._a_batch()), self.act.seq, self.k)

    def wide_spec(self) -> P:
        return P(spec_axes(*self._b_batch()), self.act.seq, self.j)

    def token_spec(self) -> P:
        return P(spec_axes(*self._b_batch()), self.act.seq)

    def weight_spec(self, kind: LinearKind) -> P:
        return P((self.k, self.i), self.j) if kind == "in" else P((self.j, self.i), self.k)

    def bias_spec(self, kind: LinearKind) -> P:
        return P(self.j) if kind == "in" else P(self.k)

    def norm_spec(self) -> P:
        return P(self.k)

    def embedding_spec(self) -> P:
        return P(self.j, self.k)

    # ---- per-device linear pieces (see GridLayout.linears) -----------------------------------
    def _gather_input(self, x, kind: LinearKind):
        """All-gather the input over its layout's minor batch axis (``j`` for A, ``k`` for B)."""
        return jax.lax.all_gather(x, self.j if kind == "in" else self.k, axis=0, tiled=True)

    def _matmul(self, x, w, kind: LinearKind):
        """All-gather the weight over ``i``, multiply, reduce-scatter the partial sums over the
        axis that split the contraction (``k`` for A → B, ``j`` for B → A) on the batch."""
        y = token_matmul(x, jax.lax.all_gather(w, self.i, axis=0, tiled=True))
        scatter = self.k if kind == "in" else self.j
        return jax.lax.psum_scatter(y, scatter, scatter_dimension=0, tiled=True)

    def tied_logits(self, x, table):
        """The table's block ``[V/q (j), h/q (k)]``, replicated over ``i``, is the transposed
        ``"in"`` weight block *after* its all-gather over ``i``: the tied head is the A → B
        linear without that gather — all-gather ``x`` over ``j``, multiply, reduce-scatter over
        ``k`` (``2·(q−1)/q³·(M·N + M·V)`` forward + backward); the table gradient is summed over
        the token axes (``data``, ``i``, ``seq``) on its block. Memory: the gathered ``x``
        ``M·N/q²`` and the partial logits ``M·V/q²``; no gathered table."""
        grad_axes = self.weight_grad_axes_of(self.embedding_spec())

        def body(x, t):
            xg = jax.lax.all_gather(x, self.j, axis=0, tiled=True)
            y = jnp.einsum("bsh,vh->bsv", xg, varying(t, grad_axes))
            return jax.lax.psum_scatter(y, self.k, scatter_dimension=0, tiled=True)

        return sharded(
            body, self.mesh, (self.residual_spec(), self.embedding_spec()), self.wide_spec()
        )(x, table)

    def residual_to_wide(self, x):
        """Layout A ``X[(b, i, j), s, (k)]`` to layout B ``X[(b, i, k), s, (j)]``: device
        ``(i, j, k)`` needs batch block ``(i, k)`` and hidden block ``j``, which device
        ``(i, k, j)`` holds — a transpose of the ``(j, k)`` grid, one ``ppermute`` of the
        ``M·N/q³`` block (:func:`~colossal_jax.tensor.kernels.grid_transpose`). Inside a
        pipeline's per-stage branches (no ``ppermute`` there,
        :func:`colossal_jax.tensor.layout.in_per_stage_branches`): all-gather the batch over
        ``j`` and the hidden over ``k`` and slice out the block (``(q−1)·M·N/q³ + (q−1)·M·N/q²``
        elements, transient ``M·N/q``). Backward: the same movement reversed."""
        per_stage = in_per_stage_branches()

        def body(x):
            if not per_stage:
                return grid_transpose(x, self.j, self.k)
            b, n = x.shape[0], x.shape[2]
            x = jax.lax.all_gather(x, self.j, axis=0, tiled=True)  # batch (b, i)
            x = jax.lax.all_gather(x, self.k, axis=2, tiled=True)  # hidden whole
            x = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(self.k) * b, b, axis=0)
            return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(self.j) * n, n, axis=2)

        return sharded(body, self.mesh, (self.residual_spec(),), self.wide_spec())(x)

    def _collective_products(self, x, ws, kind: LinearKind):
        """The plain algorithm with its larger activation collective on a ring: the
        reduce-scatter over the contraction's axis (``Σ K ≥ N``), or the input gather over the
        layout's minor batch axis; one ring serves every ``w`` (fused Q/K/V)."""
        gather, scatter = (self.j, self.k) if kind == "in" else (self.k, self.j)
        w_full = [jax.lax.all_gather(w, self.i, axis=0, tiled=True) for w in ws]
        b = x.shape[0]  # the batch block: the gather's and the scatter's
        if sum(w.shape[1] for w in w_full) >= x.shape[2]:
            x_full = jax.lax.all_gather(x, gather, axis=0, tiled=True)
            return ring_reduce_scatter(
                lambda m: [block(x_full, m, b, 0) @ w for w in w_full], scatter
            )
        steps = ring_all_gather(x, gather, lambda xj, j: (j, [xj @ w for w in w_full]))
        outs = []
        for i, w in enumerate(w_full):
            y = jnp.zeros((self.q * b, *x.shape[1:-1], w.shape[1]), steps[0][1][i].dtype)
            for j, ys in steps:
                y = jax.lax.dynamic_update_slice_in_dim(y, ys[i], j * b, axis=0)
            outs.append(jax.lax.psum_scatter(y, scatter, scatter_dimension=0, tiled=True))
        return outs
