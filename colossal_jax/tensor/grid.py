"""What every tensor-split layout shares: kernels that follow from its specs alone.

Given a layout's residual, wide, token and embedding specs, the layer norm and RMSNorm, the
embedding and the vocab-parallel cross-entropy are the same algorithm in 1D, 2D, 2.5D and 3D
(the attention head split too, in every mode: :meth:`TensorLayout.attention`) — only the axes
differ, and those are read off the specs:

- the axes splitting the residual's hidden dimension: LayerNorm all-reduces its statistics
  over them (``2·rows`` elements per direction), RMSNorm its one statistic Σx² (``rows``);
- the axes splitting the wide dimension: attention heads and the vocabulary (LM head logits)
  are split over them;
- the axes splitting the embedding table's rows: the vocabulary of the lookup. Where they also
  split the residual's batch (2D, 2.5D, 3D), each device looks up the token ids of its whole
  group and the partial rows are reduce-scattered back to the batch blocks; otherwise (1D) the
  partial rows are all-reduced.

The linear is split in two per-device pieces that subclasses implement: ``_gather_input``
(what the mode collects of the input before multiplying) and ``_matmul`` (the weight's
collective, the local product and any output collective). :meth:`GridLayout.linears` runs
several linears that read the same input — Q, K and V — in one ``shard_map`` with one input
gather, so autodiff sums their input gradients *before* the one transposed collective
(Megatron's fused QKV: one all-reduce instead of three in 1D, one reduce-scatter in 2D/3D).

With ``collective_matmul=True`` the layout runs its ``_collective_products`` instead: the same
products and the same bytes, with a gather or scatter decomposed into a ``ppermute`` ring
interleaved with partial matmuls (:mod:`colossal_jax.tensor.collective_matmul`); fused linears
still share one input ring or gather.

Subclasses implement the specs, ``_gather_input``, ``_matmul``, ``_collective_products``,
:meth:`TensorLayout.validate` and :meth:`TensorLayout.batch_divisor`; a mode whose grid is not
simply the mesh's tensor axes (2D and 2.5D: the stacked grids) overrides
:meth:`GridLayout.grid_shape`. The constructor checks the grid shape against the mode's rule
(:func:`colossal_jax.config.parallel_rules.check_grid`).
"""

from __future__ import annotations

import abc

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from colossal_jax.config.choices import TENSOR_AXES
from colossal_jax.config.parallel_rules import check_grid
from colossal_jax.tensor.kernels import (
    reduce_loss,
    split_layer_norm,
    split_rms_norm,
    varying,
    vocab_parallel_embed,
)
from colossal_jax.tensor.layout import (
    ActivationAxes,
    AxisNames,
    LinearKind,
    TensorLayout,
    in_manual_region,
    sharded,
    spec_axes,
    vocab_parallel_cross_entropy,
)


def axes_of(entry) -> AxisNames:
    """The mesh axes of one PartitionSpec entry."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


class GridLayout(TensorLayout):
    """A layout whose shared kernels are derived from its specs (see module docstring).

    ``collective_matmul``: run the linears' gathers and scatters as ``ppermute`` rings
    interleaved with partial matmuls (``--collective-matmul on``). Raises ``ConfigError`` when
    the mesh's tensor axes do not form the grid the mode computes on."""

    def __init__(
        self,
        mesh: Mesh,
        activation_axes: ActivationAxes | None = None,
        *,
        collective_matmul: bool = False,
    ):
        super().__init__(mesh, activation_axes or ActivationAxes())
        self.collective_matmul = collective_matmul
        check_grid(self.mode, *self.grid_shape())

    def grid_shape(self) -> tuple[int, int, int]:
        """``(rows, cols, depth)`` of the tensor grid, as :func:`check_grid` reads it: the sizes
        of ``tensor_row, tensor_col, tensor_depth`` (1 where the mesh lacks one)."""
        r, c, d = (self.mesh.shape.get(a, 1) for a in TENSOR_AXES)
        return r, c, d

    def hidden_axes(self) -> AxisNames:
        return axes_of(self.residual_spec()[2])

    def wide_axes(self) -> AxisNames:
        return axes_of(self.wide_spec()[2])

    def token_axes(self) -> AxisNames:
        return tuple(a for entry in self.token_spec() for a in axes_of(entry))

    def weight_grad_axes(self, kind: LinearKind) -> AxisNames:
        """Axes that split the tokens but not the weight: its gradient is summed over them."""
        return self.weight_grad_axes_of(self.weight_spec(kind))

    def weight_grad_axes_of(self, spec: P) -> AxisNames:
        """Axes that split the tokens but not a parameter of ``spec``."""
        w_axes = {a for entry in spec for a in axes_of(entry)}
        return tuple(a for a in self.token_axes() if a not in w_axes)

    @abc.abstractmethod
    def _gather_input(self, x: jax.Array, kind: LinearKind) -> jax.Array:
        """Per device: the input block as the local matmul needs it."""

    @abc.abstractmethod
    def _matmul(self, x: jax.Array, w: jax.Array, kind: LinearKind) -> jax.Array:
        """Per device: gathered input times the weight block, in the output layout."""

    @abc.abstractmethod
    def _collective_products(
        self, x: jax.Array, ws: list[jax.Array], kind: LinearKind
    ) -> list[jax.Array]:
        """Per device: ``[_matmul(_gather_input(x), w) for w in ws]`` as collective matmuls."""

    def _products(self, x: jax.Array, ws: list[jax.Array], kind: LinearKind) -> list[jax.Array]:
        if self.collective_matmul:
            return self._collective_products(x, ws, kind)
        xg = self._gather_input(x, kind)
        return [self._matmul(xg, w, kind) for w in ws]

    def linear(self, x, w, b, kind: LinearKind):
        return self.linears(x, [w], None if b is None else [b], kind)[0]

    def linears(self, x, ws, bs, kind: LinearKind):
        src, dst = (
            (self.residual_spec(), self.wide_spec())
            if kind == "in"
            else (self.wide_spec(), self.residual_spec())
        )
        grad_axes = self.weight_grad_axes(kind)
        n = len(ws)

        def body(x, ws, *bs):
            # the weight block is marked varying over the token axes *before* its gather, so its
            # gradient is reduced over them on the small local block
            ys = self._products(x, [varying(w, grad_axes) for w in ws], kind)
            return [y + b for y, b in zip(ys, bs[0], strict=True)] if bs else ys

        in_specs = (src, [self.weight_spec(kind)] * n)
        args = (x, list(ws))
        if bs is not None:
            in_specs += ([self.bias_spec(kind)] * n,)
            args += (list(bs),)
        return sharded(body, self.mesh, in_specs, [dst] * n)(*args)

    def layer_norm(self, x, scale, bias, eps: float):
        spec = self.residual_spec()
        hidden = self.hidden_axes()
        return sharded(
            lambda x, s, b: split_layer_norm(x, s, b, eps, hidden_axes=hidden),
            self.mesh,
            (spec, self.norm_spec(), self.norm_spec()),
            spec,
        )(x, scale, bias)

    def rms_norm(self, x, scale, eps: float):
        spec = self.residual_spec()
        hidden = self.hidden_axes()
        return sharded(
            lambda x, s: split_rms_norm(x, s, eps, hidden_axes=hidden),
            self.mesh,
            (spec, self.norm_spec()),
            spec,
        )(x, scale)

    def embed(self, tokens, table):
        vocab = axes_of(self.embedding_spec()[0])
        batch = axes_of(self.residual_spec()[0])
        scatter = bool(vocab) and batch[-len(vocab) :] == vocab
        ids_batch = batch[: -len(vocab)] if scatter else batch
        ids_spec = P(spec_axes(*ids_batch), self.residual_spec()[1])
        if in_manual_region():
            # per-device blocks arrive in the token spec; collect what ids_spec holds, as the
            # shard_map's in_spec would (3D: the token batch is split over k, the ids over i)
            held = axes_of(self.token_spec()[0])
            want = axes_of(ids_spec[0])
            if held[: len(want)] != want:
                raise ValueError(f"{self.mode}: ids spec {ids_spec} is not a prefix of the tokens'")
            if held[len(want) :]:
                tokens = jax.lax.all_gather(tokens, held[len(want) :], axis=0, tiled=True)
        return sharded(
            lambda ids, tab: vocab_parallel_embed(ids, tab, vocab_axes=vocab, scatter=scatter),
            self.mesh,
            (ids_spec, self.embedding_spec()),
            self.residual_spec(),
        )(tokens, table)

    def cross_entropy(self, logits, targets, weights):
        tokens = self.token_spec()
        vocab, token_axes = self.wide_axes(), self.token_axes()

        def body(logits, targets, weights):
            total, count = vocab_parallel_cross_entropy(logits, targets, weights, vocab)
            return reduce_loss(total, count, token_axes)

        return sharded(body, self.mesh, (self.wide_spec(), tokens, tokens), (P(), P()))(
            logits, targets, weights
        )
