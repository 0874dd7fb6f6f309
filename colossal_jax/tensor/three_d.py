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
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.grid import GridLayout
from colossal_jax.tensor.kernels import (
    summa_matmul,
    varying,
)
from colossal_jax.tensor.layout import (
    ActivationAxes,
    LinearKind,
    check_divisible,
    spec_axes,
)


class ThreeDLayout(GridLayout):
    mode = "3d"
    i = "tensor_row"
    j = "tensor_col"
    k = "tensor_depth"

    def __init__(self, mesh, activation_axes: ActivationAxes | None = None):
        super().__init__(mesh, activation_axes or ActivationAxes())
        sides = [self.axis_size(a) for a in (self.i, self.j, self.k)]
        if len(set(sides)) != 1:
            raise ValueError(
                f"3d needs a cube tensor_row == tensor_col == tensor_depth, got "
                f"{sides[0]}×{sides[1]}×{sides[2]}"
            )

    @property
    def q(self) -> int:
        return self.axis_size(self.i)

    def _a_batch(self) -> tuple[str, ...]:
        return (*self.act.batch, self.i, self.j)

    def _b_batch(self) -> tuple[str, ...]:
        return (*self.act.batch, self.i, self.k)

    def _reduce_axes(self) -> tuple[str, ...]:
        """Axes that split tokens but not weights: weight gradients are summed over them."""
        return tuple(a for a in (*self.act.batch, self.act.seq) if a is not None)

    def batch_divisor(self) -> int:
        return self.axis_size(self.act.batch) * self.q * self.q

    def validate(self, *, hidden: int, mlp: int, heads: int, vocab: int) -> None:
        q = self.q
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by heads={heads}")
        needs = (
            ("hidden size", hidden, q * q),
            ("mlp width", mlp, q * q),
            ("heads", heads, q),
            ("vocab size", vocab, q),
        )
        check_divisible(f"3d on a {q}×{q}×{q} cube", needs, heads)

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

    # ---- kernels ------------------------------------------------------------------------------
    def linear(self, x, w, b, kind: LinearKind):
        """A → B (``"in"``) or B → A (``"out"``): gather ``X`` over the input layout's minor
        batch axis, gather ``W`` over ``i``, reduce-scatter the product over the axis that split
        the contraction."""
        gather, scatter = (self.j, self.k) if kind == "in" else (self.k, self.j)
        src, dst = (
            (self.residual_spec(), self.wide_spec())
            if kind == "in"
            else (self.wide_spec(), self.residual_spec())
        )
        grad_axes = self._reduce_axes()

        def body(x, w, *b):
            y = summa_matmul(
                x,
                varying(w, grad_axes),
                x_gather=gather,
                x_gather_dim=0,
                w_gather=self.i,
                scatter=scatter,
                scatter_dim=0,
            )
            return y + b[0] if b else y

        specs = (src, self.weight_spec(kind)) + (() if b is None else (self.bias_spec(kind),))
        args = (x, w) if b is None else (x, w, b)
        return jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=dst)(*args)
