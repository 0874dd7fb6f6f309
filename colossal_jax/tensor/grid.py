"""What every tensor-split layout shares: kernels that follow from its specs alone.

Given a layout's residual, wide, token and embedding specs, the layer norm, the embedding, the
attention head split and the vocab-parallel cross-entropy are the same algorithm in 1D, 2D,
2.5D and 3D — only the axes differ, and those are read off the specs:

- the axes splitting the residual's hidden dimension: LayerNorm all-reduces its statistics
  over them (``2·rows`` elements per direction);
- the axes splitting the wide dimension: attention heads and the vocabulary (LM head logits)
  are split over them;
- the axes splitting the embedding table's rows: the vocabulary of the lookup. Where they also
  split the residual's batch (2D, 2.5D, 3D), each device looks up the token ids of its whole
  group and the partial rows are reduce-scattered back to the batch blocks; otherwise (1D) the
  partial rows are all-reduced.

Subclasses implement the specs, :meth:`TensorLayout.linear`, :meth:`TensorLayout.validate`
and :meth:`TensorLayout.batch_divisor`.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.kernels import reduce_loss, split_layer_norm, vocab_parallel_embed
from colossal_jax.tensor.layout import (
    AxisNames,
    LocalAttention,
    TensorLayout,
    attention_in_shard_map,
    spec_axes,
    vocab_parallel_cross_entropy,
)


def axes_of(entry) -> AxisNames:
    """The mesh axes of one PartitionSpec entry."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


class GridLayout(TensorLayout):
    """A layout whose shared kernels are derived from its specs (see module docstring)."""

    def hidden_axes(self) -> AxisNames:
        return axes_of(self.residual_spec()[2])

    def wide_axes(self) -> AxisNames:
        return axes_of(self.wide_spec()[2])

    def token_axes(self) -> AxisNames:
        return tuple(a for entry in self.token_spec() for a in axes_of(entry))

    def layer_norm(self, x, scale, bias, eps: float):
        spec = self.residual_spec()
        hidden = self.hidden_axes()
        return jax.shard_map(
            lambda x, s, b: split_layer_norm(x, s, b, eps, hidden_axes=hidden),
            mesh=self.mesh,
            in_specs=(spec, self.norm_spec(), self.norm_spec()),
            out_specs=spec,
        )(x, scale, bias)

    def embed(self, tokens, table):
        vocab = axes_of(self.embedding_spec()[0])
        batch = axes_of(self.residual_spec()[0])
        scatter = bool(vocab) and batch[-len(vocab) :] == vocab
        ids_batch = batch[: -len(vocab)] if scatter else batch
        ids_spec = P(spec_axes(*ids_batch), self.residual_spec()[1])
        return jax.shard_map(
            lambda ids, tab: vocab_parallel_embed(ids, tab, vocab_axes=vocab, scatter=scatter),
            mesh=self.mesh,
            in_specs=(ids_spec, self.embedding_spec()),
            out_specs=self.residual_spec(),
        )(tokens, table)

    def attention(self, q, k, v, positions, *, heads: int, local_attention: LocalAttention):
        return attention_in_shard_map(
            self,
            q,
            k,
            v,
            positions,
            heads=heads,
            head_split=self.axis_size(self.wide_axes()),
            local_attention=local_attention,
        )

    def cross_entropy(self, logits, targets, weights):
        tokens = self.token_spec()
        vocab, token_axes = self.wide_axes(), self.token_axes()

        def body(logits, targets, weights):
            total, count = vocab_parallel_cross_entropy(logits, targets, weights, vocab)
            return reduce_loss(total, count, token_axes)

        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=(self.wide_spec(), tokens, tokens),
            out_specs=(P(), P()),
        )(logits, targets, weights)
