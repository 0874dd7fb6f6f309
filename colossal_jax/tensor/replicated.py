"""Mode ``none``: no tensor parallelism; every weight whole on every device.

Data and sequence parallelism still apply through :class:`ActivationAxes`: the batch is split
over the data axes and the sequence over the seq axis by sharding annotations, which XLA's SPMD
partitioner (GSPMD) turns into per-device programs. Attention is the only ``shard_map`` here,
because sequence-parallel attention kernels (ring, Ulysses) need explicit collectives.

Communication per device: none inside a layer (gradient all-reduce over ``data`` belongs to the
training step). Memory per device: all weights; activations ``b·s·h / (data·seq)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from colossal_jax.tensor.kernels import lookup_rows, split_rms_norm, token_matmul
from colossal_jax.tensor.layout import (
    LinearKind,
    TensorLayout,
    in_manual_region,
    spec_axes,
)


class ReplicatedLayout(TensorLayout):
    mode = "none"

    def batch_divisor(self) -> int:
        return self.axis_size(self.act.batch)

    def residual_spec(self) -> P:
        return P(spec_axes(*self.act.batch), self.act.seq, None)

    wide_spec = residual_spec

    def token_spec(self) -> P:
        return P(spec_axes(*self.act.batch), self.act.seq)

    def weight_spec(self, kind: LinearKind) -> P:
        return P(None, None)

    def bias_spec(self, kind: LinearKind) -> P:
        return P(None)

    def norm_spec(self) -> P:
        return P(None)

    def embedding_spec(self) -> P:
        return P(None, None)

    def linear(self, x, w, b, kind: LinearKind):
        y = token_matmul(x, w)
        return y if b is None else y + b

    def layer_norm(self, x, scale, bias, eps: float):
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + eps)
        return (y * scale + bias).astype(x.dtype)

    def rms_norm(self, x, scale, eps: float):
        return split_rms_norm(x, scale, eps, hidden_axes=())

    def embed(self, tokens, table):
        return lookup_rows(table, tokens)

    def tied_logits(self, x, table):
        return jnp.einsum("bsh,vh->bsv", x, table)

    def cross_entropy(self, logits, targets, weights):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        w = weights.astype(jnp.float32)
        total, count = jnp.sum(nll * w), jnp.sum(w)
        if in_manual_region():  # per-device blocks: the sums over the batch are explicit
            axes = tuple(a for a in (*self.act.batch, self.act.seq) if a is not None)
            total, count = jax.lax.psum(total, axes), jax.lax.psum(count, axes)
        return total, count
