"""The only layers models use: Dense, HiddenDense, LayerNorm, RMSNorm, Embed, SelfAttention, MLP,
SwiGLU.

Each parameter is created with a ``role`` that the sharding rules map to the active layout's
PartitionSpec, and each call is routed to the active layout's kernel. ``kind="in"`` linears go
from the hidden size to a wider one (QKV, MLP up, LM head), ``kind="out"`` back to the hidden size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers import linear_tape
from colossal_jax.layers.context import active
from colossal_jax.layers.rope import with_rope
from colossal_jax.tensor.layout import LinearKind

_normal = jax.nn.initializers.normal


class Dense(nnx.Module):
    """``y = x @ W + b`` with ``W: [in, out]``; ``kind`` says which way the layer maps."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        kind: LinearKind,
        rngs: nnx.Rngs,
        use_bias: bool = True,
        init_std: float = 0.02,
    ):
        self.kind = kind
        self.kernel = nnx.Param(
            _normal(init_std)(rngs.params(), (in_features, out_features), jnp.float32),
            role=f"weight_{kind}",
        )
        self.bias = (
            nnx.Param(jnp.zeros((out_features,), jnp.float32), role=f"bias_{kind}")
            if use_bias
            else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        b = None if self.bias is None else self.bias[...]
        return linear_tape.linear(x, self.kernel[...], b, self.kind)


class HiddenDense(nnx.Module):
    """``y = x @ W + b`` with ``W: [h, h]`` from the residual stream back to it (BERT's masked-LM
    transform). The residual is re-cut to the wide layout
    (:meth:`~colossal_jax.tensor.layout.TensorLayout.residual_to_wide`) and multiplied by the
    ``"out"`` kernel, whose ``[h, h]`` weight is split as attention's output projection."""

    def __init__(self, features: int, *, rngs: nnx.Rngs, init_std: float = 0.02):
        self.kernel = nnx.Param(
            _normal(init_std)(rngs.params(), (features, features), jnp.float32),
            role="weight_out",
        )
        self.bias = nnx.Param(jnp.zeros((features,), jnp.float32), role="bias_out")

    def __call__(self, x: jax.Array) -> jax.Array:
        layout = active().layout
        wide = layout.residual_to_wide(x)
        return linear_tape.linear(wide, self.kernel[...], self.bias[...], "out")


class LayerNorm(nnx.Module):
    """LayerNorm over the hidden dimension (split or not, as the layout has it)."""

    def __init__(self, features: int, *, eps: float = 1e-5):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((features,), jnp.float32), role="norm")
        self.bias = nnx.Param(jnp.zeros((features,), jnp.float32), role="norm")

    def __call__(self, x: jax.Array) -> jax.Array:
        return active().layout.layer_norm(x, self.scale[...], self.bias[...], self.eps)


class RMSNorm(nnx.Module):
    """RMSNorm (Zhang & Sennrich 2019): ``x / rms(x) · scale`` over the hidden dimension (split or
    not, as the layout has it); no mean, no bias."""

    def __init__(self, features: int, *, eps: float = 1e-6):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((features,), jnp.float32), role="norm")

    def __call__(self, x: jax.Array) -> jax.Array:
        return active().layout.rms_norm(x, self.scale[...], self.eps)


class Embed(nnx.Module):
    """A lookup table ``[num, features]`` (token or learned-position embedding)."""

    def __init__(self, num: int, features: int, *, rngs: nnx.Rngs, init_std: float = 0.02):
        self.table = nnx.Param(
            _normal(init_std)(rngs.params(), (num, features), jnp.float32), role="embedding"
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        return active().layout.embed(ids, self.table[...])

    def attend(self, x: jax.Array) -> jax.Array:
        """``x @ table.T``: logits over the table's rows (a tied LM head), wide layout,
        vocabulary-parallel where the layout splits it; the table's gradients from the lookup
        and from here add up."""
        return active().layout.tied_logits(x, self.table[...])


class SelfAttention(nnx.Module):
    """Multi-head self-attention; the attention kernel comes from the sequence mode. With
    ``rope_theta`` queries and keys are rotated by their positions (RoPE) inside the kernel.

    ``causal`` (the model's choice: GPT causal, BERT/ViT not) is passed to every kernel. Padding
    needs no flag: tokens with a negative position are never attended to (see
    :mod:`colossal_jax.tensor.layout`). ``kv_heads`` (dividing ``heads``; default ``heads``)
    makes it grouped-query attention (Ainslie et al. 2023): the key and value projections are
    ``kv_heads·head_dim`` wide and each serves ``heads/kv_heads`` query heads. ``use_bias=False``
    drops the four projections' biases (LLaMA)."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        *,
        rngs: nnx.Rngs,
        out_std: float = 0.02,
        rope_theta: float | None = None,
        causal: bool = True,
        kv_heads: int | None = None,
        use_bias: bool = True,
    ):
        kv_heads = heads if kv_heads is None else kv_heads
        if hidden % heads or heads % kv_heads:
            raise ValueError(
                f"SelfAttention needs heads={heads} dividing hidden={hidden} and kv_heads="
                f"{kv_heads} dividing heads"
            )
        self.heads = heads
        self.kv_heads = kv_heads
        self.rope_theta = rope_theta
        self.causal = causal
        kv_width = kv_heads * (hidden // heads)
        self.query = Dense(hidden, hidden, kind="in", rngs=rngs, use_bias=use_bias)
        self.key = Dense(hidden, kv_width, kind="in", rngs=rngs, use_bias=use_bias)
        self.value = Dense(hidden, kv_width, kind="in", rngs=rngs, use_bias=use_bias)
        self.out = Dense(hidden, hidden, kind="out", rngs=rngs, init_std=out_std, use_bias=use_bias)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        par = active()
        local = par.local_attention
        if self.rope_theta is not None:
            local = with_rope(local, self.rope_theta)
        dense = (self.query, self.key, self.value)
        biases = None if any(d.bias is None for d in dense) else [d.bias[...] for d in dense]
        # one call: layouts gather x once and reduce its gradient once (fused QKV)
        q, k, v = linear_tape.linears(x, [d.kernel[...] for d in dense], biases, "in")
        o = par.layout.attention(
            q,
            k,
            v,
            positions,
            heads=self.heads,
            local_attention=local,
            causal=self.causal,
            kv_heads=self.kv_heads,
        )
        return self.out(o)


class MLP(nnx.Module):
    """``h -> width -> h`` with GeLU: the tanh approximation (as GPT-2) or, with
    ``approximate=False``, the exact erf form (as BERT and ViT)."""

    def __init__(
        self,
        hidden: int,
        width: int,
        *,
        rngs: nnx.Rngs,
        out_std: float = 0.02,
        approximate: bool = True,
    ):
        self.approximate = approximate
        self.up = Dense(hidden, width, kind="in", rngs=rngs)
        self.down = Dense(width, hidden, kind="out", rngs=rngs, init_std=out_std)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(x), approximate=self.approximate))


class SwiGLU(nnx.Module):
    """Gated MLP (Shazeer 2020, arXiv 2002.05202): ``down(silu(x @ W_gate) · (x @ W_up))``.

    The two up-projections read the same ``x`` and run in one layout call (like Q/K/V), so the
    layout gathers ``x`` once and reduces its gradient once; gate and up come out in the same
    wide layout, so the gating product is elementwise on each device's block.
    """

    def __init__(
        self,
        hidden: int,
        width: int,
        *,
        rngs: nnx.Rngs,
        out_std: float = 0.02,
        use_bias: bool = False,
    ):
        self.gate = Dense(hidden, width, kind="in", rngs=rngs, use_bias=use_bias)
        self.up = Dense(hidden, width, kind="in", rngs=rngs, use_bias=use_bias)
        self.down = Dense(width, hidden, kind="out", rngs=rngs, init_std=out_std, use_bias=use_bias)

    def __call__(self, x: jax.Array) -> jax.Array:
        dense = (self.gate, self.up)
        biases = None if self.gate.bias is None else [d.bias[...] for d in dense]
        g, u = linear_tape.linears(x, [d.kernel[...] for d in dense], biases, "in")
        return self.down(jax.nn.silu(g) * u)


def token_loss_sums(
    logits: jax.Array, targets: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(Σ weight·cross-entropy, Σ weight)`` of wide-layout logits (vocabulary-parallel where
    split). Sums, not a mean, so microbatches and pipeline stages can add them up."""
    return active().layout.cross_entropy(logits, targets, weights)


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
    """Mean token cross-entropy of wide-layout logits (vocabulary-parallel where split)."""
    total, count = token_loss_sums(logits, targets, weights)
    return total / jnp.maximum(count, 1.0)
