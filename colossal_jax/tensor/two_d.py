"""Mode ``2d``: SUMMA-style 2D tensor parallelism on a q×q grid (Optimus, Xu et al. 2021,
arXiv 2104.05343; SUMMA, van de Geijn & Watts 1997).

Axes ``r = tensor_row``, ``c = tensor_col``, p = q². Every activation ``[b, s, n]`` is split in
``q×q`` blocks: batch over ``r`` (after the data axes), hidden over ``c``; every weight ``[N, K]``
in blocks ``W[N/q, K/q]`` over ``(r, c)``. A linear all-gathers ``X`` along ``c`` (its hidden
blocks) and ``W`` along ``r`` (its row blocks), then does one local matmul whose output is
already in the same block layout — so layouts chain from layer to layer and no full
``[tokens, hidden]`` activation ever exists on a device.

Communication per device, one linear ``[M, N] @ [N, K]`` forward + backward (autodiff keeps the
gathered blocks): ``2·(q−1)/q²·(M·N + N·K)`` elements. Memory per device: weights ``N·K/q²``,
activations ``M·N/q²`` (falls as 1/p), plus the transient gathered blocks ``M·N/q`` and
``N·K/q``. Layer norm all-reduces its statistics over ``c`` (``2·M/q`` elements twice).

Collective matmul (``--collective-matmul on``; Wang et al. 2023, ASPLOS): both gathers are along
the contraction, so ``Y = Σ_j X_j·W_j`` over the ``q`` hidden blocks. The larger of the two
gathered operands goes round its ring (``X`` over ``c``, or ``W`` over ``r``) and each step adds
one partial product ``X_j·W_j`` with the matching block of the other, which is all-gathered as
before. Same elements per device, ``(q−1)`` permutes of the ringed block instead of its
all-gather; the algorithm's transient gathered block of the ringed operand falls to two blocks
in flight (autodiff keeps the ``q`` blocks for the backward pass, whose ring — the transpose —
is the reduce-scatter of that operand's gradient, each step one partial matmul).

2.5D (:mod:`colossal_jax.tensor.two_p5d`) is this layout with ``d`` stacked grids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.collective_matmul import block, ring_all_gather
from colossal_jax.tensor.grid import GridLayout
from colossal_jax.tensor.kernels import grid_transpose, token_matmul, varying
from colossal_jax.tensor.layout import (
    LinearKind,
    in_per_stage_branches,
    sharded,
    spec_axes,
)


class TwoDLayout(GridLayout):
    mode = "2d"
    row: str = "tensor_row"
    col: str = "tensor_col"
    depth: tuple[str, ...] = ()
    """Axes that stack independent grids (2.5D): they split the batch and replicate weights."""

    def grid_shape(self) -> tuple[int, int, int]:
        """``(q_row, q_col, grids)``: the 2D grid and how many copies of it are stacked (the
        product of the :attr:`depth` axes, 1 in 2D); raises ``ValueError`` when the mesh lacks a
        depth axis."""
        for a in self.depth:
            if a not in self.mesh.shape:
                raise ValueError(f"{self.mode} needs a {a!r} mesh axis")
        return self.axis_size(self.row), self.axis_size(self.col), self.axis_size(self.depth)

    @property
    def q(self) -> int:
        return self.axis_size(self.row)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """Axes splitting the batch dimension, major to minor: data, depth, row."""
        return (*self.act.batch, *self.depth, self.row)

    def batch_divisor(self) -> int:
        return self.axis_size(self.batch_axes)

    # ---- specs -------------------------------------------------------------------------------
    def residual_spec(self) -> P:
        return P(spec_axes(*self.batch_axes), self.act.seq, self.col)

    wide_spec = residual_spec

    def token_spec(self) -> P:
        return P(spec_axes(*self.batch_axes), self.act.seq)

    def weight_spec(self, kind: LinearKind) -> P:
        return P(self.row, self.col)

    def bias_spec(self, kind: LinearKind) -> P:
        return P(self.col)

    def norm_spec(self) -> P:
        return P(self.col)

    def embedding_spec(self) -> P:
        return P(self.row, self.col)

    # ---- per-device linear pieces (see GridLayout.linears) -----------------------------------
    def _gather_input(self, x, kind: LinearKind):
        """All-gather the input's hidden blocks over ``c`` (``M·N/q·(q−1)/q`` per device)."""
        return jax.lax.all_gather(x, self.col, axis=2, tiled=True)

    def _matmul(self, x, w, kind: LinearKind):
        """All-gather the weight's row blocks over ``r`` and multiply: the output
        ``[M/q, K/q]`` block is already in the activation layout."""
        return token_matmul(x, jax.lax.all_gather(w, self.row, axis=0, tiled=True))

    def tied_logits(self, x, table):
        """The tied LM head on the grid. The table's block on device ``(i, j)`` is
        ``T[V/q (i), h/q (j)]`` (the lookup's layout), the transpose of what the ``"in"`` linear
        wants (``W[h/q (i), V/q (j)]``), so:

        - ordinarily, a grid transpose (:func:`~colossal_jax.tensor.kernels.grid_transpose`,
          device ``(i, j)`` receives ``T[V_j, h_i]`` from ``(j, i)``: ``V·h/q²``) turns it into
          the linear's weight block, then the SUMMA linear as for any ``"in"`` weight (all-gather
          ``x`` over ``c`` and the block over ``r``);
        - inside a pipeline's per-stage branches (where a ``ppermute`` would wait for devices
          running other branches, :func:`colossal_jax.tensor.layout.in_per_stage_branches`),
          all-gather the table over ``r`` (``T[V, h_j]``), multiply by the local ``x[b_i, h_j]``
          and reduce-scatter the partial logits over ``c`` on the vocabulary:
          ``M·V/q·(q−1)/q`` instead of the ``x`` gather's ``M·N/q·(q−1)/q``.

        The table gradient is summed over the token axes the table is not split over (``data``,
        2.5D depth, ``seq``) on its block. Memory: the transient gathered table ``V·h/q`` (as an
        ``"in"`` weight's gather) and the ``x`` gather ``M·h/q`` (per-stage path: the partial
        logits ``M·V/q`` instead).
        """
        grad_axes = self.weight_grad_axes_of(self.embedding_spec())
        per_stage = in_per_stage_branches()

        def body(x, t):
            t = varying(t, grad_axes)
            if per_stage:
                t = jax.lax.all_gather(t, self.row, axis=0, tiled=True)  # [V, h/q]
                y = jnp.einsum("bsh,vh->bsv", x, t)
                return jax.lax.psum_scatter(y, self.col, scatter_dimension=2, tiled=True)
            t = grid_transpose(t, self.row, self.col)  # [V/q (j), h/q (i)]
            t = jax.lax.all_gather(t, self.row, axis=1, tiled=True)  # [V/q (j), h]
            return jnp.einsum("bsh,vh->bsv", self._gather_input(x, "in"), t)

        return sharded(
            body, self.mesh, (self.residual_spec(), self.embedding_spec()), self.wide_spec()
        )(x, table)

    def _collective_products(self, x, ws, kind: LinearKind):
        """``Σ_j X_j·W_j`` with the larger operand on its ring: ``X``'s hidden blocks over
        ``c`` (one ring shared by every ``w``, the weights all-gathered over ``r``) or the
        weights' row blocks over ``r`` (one ring carrying every ``w``, ``X`` all-gathered)."""
        n = x.shape[2]  # the hidden block: N/q
        if x.size >= sum(w.size for w in ws):
            w_full = [jax.lax.all_gather(w, self.row, axis=0, tiled=True) for w in ws]
            steps = ring_all_gather(
                x, self.col, lambda xj, j: [xj @ block(w, j, n, 0) for w in w_full]
            )
        else:
            x_full = jax.lax.all_gather(x, self.col, axis=2, tiled=True)
            steps = ring_all_gather(
                list(ws), self.row, lambda wjs, j: [block(x_full, j, n, 2) @ wj for wj in wjs]
            )
        return [sum(ys) for ys in zip(*steps, strict=True)]
