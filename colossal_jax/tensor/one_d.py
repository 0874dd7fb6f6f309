"""Mode ``1d``: Megatron-LM tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053).

The tensor group is ``t = (tensor_row, tensor_col, tensor_depth)`` flattened (p devices). The
residual stream ``[b, s, h]`` is replicated over ``t``; an ``"in"`` linear is split by columns
(``W[:, K/p]``, output ``[b, s, K/p]``), an ``"out"`` linear by rows (``W[K/p, :]``) followed by
an all-reduce. Attention heads follow the column split; the embedding and the LM head split the
vocabulary, with a vocab-parallel cross-entropy.

Communication per device, one column/row pair (M = b·s tokens, N = h):
forward one all-reduce of ``M·N`` (``2·M·N·(p−1)/p`` elements), backward one more for the column
linear's input gradient. Memory per device: weights ``N·K/p``; activations: the residual stream
``M·N`` unsharded (does *not* fall with p), the wide activations ``M·K/p``.

Collective matmul (``--collective-matmul on``; Wang et al. 2023, ASPLOS): each all-reduce is
run as a reduce-scatter ring over ``N/p`` column blocks, every step one partial matmul, then an
all-gather (:func:`~colossal_jax.tensor.collective_matmul.matmul_all_reduce`,
:func:`~colossal_jax.tensor.collective_matmul.column_matmuls`): the same ``2·M·N·(p−1)/p``
elements per all-reduce, ``p−1`` permutes of ``M·N/p`` plus one all-gather; the algorithm's
transient partial product falls from ``M·N`` to ``M·N/p`` (XLA's CPU allocation shows no saving:
docs/performance.md).
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.collective_matmul import column_matmuls, matmul_all_reduce
from colossal_jax.tensor.grid import GridLayout
from colossal_jax.tensor.kernels import token_matmul, varying
from colossal_jax.tensor.layout import LinearKind, sharded, spec_axes

TENSOR_AXES = ("tensor_row", "tensor_col", "tensor_depth")


class OneDLayout(GridLayout):
    mode = "1d"

    @property
    def t(self) -> tuple[str, ...]:
        """The tensor group: every tensor axis present in the mesh."""
        return tuple(a for a in TENSOR_AXES if a in self.mesh.shape)

    @property
    def p(self) -> int:
        return self.axis_size(self.t)

    def batch_divisor(self) -> int:
        return self.axis_size(self.act.batch)

    # ---- specs -------------------------------------------------------------------------------
    def residual_spec(self) -> P:
        return P(spec_axes(*self.act.batch), self.act.seq, None)

    def wide_spec(self) -> P:
        return P(spec_axes(*self.act.batch), self.act.seq, self.t)

    def token_spec(self) -> P:
        return P(spec_axes(*self.act.batch), self.act.seq)

    def weight_spec(self, kind: LinearKind) -> P:
        return P(None, self.t) if kind == "in" else P(self.t, None)

    def bias_spec(self, kind: LinearKind) -> P:
        return P(self.t) if kind == "in" else P(None)

    def norm_spec(self) -> P:
        return P(None)

    def embedding_spec(self) -> P:
        return P(self.t, None)

    def residual_to_wide(self, x):
        """The replicated residual's hidden block of this device (``h/p`` columns, block index
        = linear index over ``t``): a slice, no communication; its transpose sums the input
        gradient's blocks over ``t`` (one all-reduce of ``M·N``, as a column linear's input
        gradient). Memory: the ``M·N/p`` slice."""
        t, p = self.t, self.p

        def body(x):
            n = x.shape[-1] // p
            x = varying(x, t)
            return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(t) * n, n, axis=2)

        return sharded(body, self.mesh, (self.residual_spec(),), self.wide_spec())(x)

    # ---- per-device linear pieces (see GridLayout.linears) -----------------------------------
    def _gather_input(self, x, kind: LinearKind):
        """The column linear's input is replicated over ``t``: nothing to gather, but it is
        cast to varying over ``t`` once, so the transposed cast — one all-reduce of the summed
        input gradient (``2·M·N·(p−1)/p``) — serves every linear sharing ``x``."""
        return varying(x, self.t) if kind == "in" else x

    def _matmul(self, x, w, kind: LinearKind):
        """Column (``"in"``): ``x @ w`` into ``[M, K/p]``. Row (``"out"``): ``psum(x @ w)``, the
        forward all-reduce of the output (``2·M·N·(p−1)/p``)."""
        y = token_matmul(x, w)
        return y if kind == "in" else jax.lax.psum(y, self.t)

    def tied_logits(self, x, table):
        """The table ``[V/p, h]`` split by rows is, transposed, exactly the column linear's
        weight ``[h, V/p]``: the tied head *is* the column linear (no extra communication; the
        input gradient's all-reduce over ``t`` as for any column linear)."""
        return self.linear(x, table.T, None, "in")

    def _collective_products(self, x, ws, kind: LinearKind):
        """Column (``"in"``): local products whose backward all-reduces the summed input
        gradient by the ring. Row (``"out"``): the output all-reduce by the ring, each step one
        partial matmul ``x @ w[:, block]``; its backward moves nothing."""
        if kind == "in":
            return column_matmuls(x, ws, self.t)
        return [matmul_all_reduce(x, w, self.t) for w in ws]
