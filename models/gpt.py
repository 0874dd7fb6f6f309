"""GPT-2 / GPT-3 family (Radford et al. 2019; Brown et al. 2020), written once.

Built only from the library's layers: the same file trains under data, tensor (1D/2D/2.5D/3D) and
sequence parallelism, because each layer routes to the active layout. Differences from GPT-2: the
LM head is not tied to the token embedding (tying would force one layout on two different uses of
one table), and positions are an explicit input, so a sequence split and reordered over devices
(zigzag ring attention) keeps every token's true position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers import MLP, Dense, Embed, LayerNorm, SelfAttention, Stack
from colossal_jax.layers.model import SequenceModel
from colossal_jax_models.gpt_config import GPTConfig

__all__ = ["GPT", "Block", "GPTConfig", "count_params"]


class Block(nnx.Module):
    """One pre-LN transformer layer: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        out_std = 0.02 / (2 * cfg.n_layer) ** 0.5  # GPT-2's scaled init of residual projections
        self.ln1 = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.attn = SelfAttention(
            cfg.n_embd,
            cfg.n_head,
            rngs=rngs,
            out_std=out_std,
            rope_theta=cfg.rope_theta if cfg.position == "rope" else None,
        )
        self.ln2 = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.mlp = MLP(cfg.n_embd, cfg.mlp_width, rngs=rngs, out_std=out_std)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), positions)
        return x + self.mlp(self.ln2(x))


class GPT(SequenceModel):
    """``embed → blocks → head``: the three parts a pipeline schedule, gradient accumulation and
    remat wrap. ``blocks`` is a :class:`Stack` (stacked parameters, run by a scan)."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs, unroll: bool | None = None):
        self.cfg = cfg
        self.wte = Embed(cfg.vocab_size, cfg.n_embd, rngs=rngs)
        self.wpe = (
            Embed(cfg.block_size, cfg.n_embd, rngs=rngs) if cfg.position == "learned" else None
        )
        self.blocks = Stack(lambda r: Block(cfg, rngs=r), cfg.n_layer, rngs=rngs, unroll=unroll)
        self.ln_f = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.lm_head = Dense(cfg.n_embd, cfg.vocab_size, kind="in", rngs=rngs, use_bias=False)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Token (+ learned position) embeddings ``[b, s, h]``."""
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(jnp.maximum(positions, 0))  # padding: negative positions
        return x

    def logits(self, x: jax.Array) -> jax.Array:
        return self.lm_head(self.ln_f(x))


def count_params(state) -> int:
    return sum(int(jnp.size(x)) for x in jax.tree.leaves(state))
