"""Vision Transformer (Dosovitskiy et al. 2021, arXiv 2010.11929), written once on the library's
layers.

An image arrives as tokens (:mod:`colossal_jax.data.images`): row 0 is the class token's slot, rows
``1..P`` the flattened patches. The patch embedding is a dense map of each token's pixels
(:class:`~colossal_jax.layers.FeatureEmbed`) with one more input, the indicator of the class
slot, so the class token is that input's learned row (plus the shared bias): ViT's learnable
``x_class`` with no layout of its own. Learned positions, pre-LN encoder layers with attention
over every position (``causal=False``), a final LayerNorm and a linear head
(zero-initialised, as the paper's). The head runs on every token; the data's loss weights (1 at
the class position, 0 elsewhere) make the loss the class token's, so pipelines, accumulation
and ZeRO need nothing new. GELU is the tanh approximation of the library's MLP unless
``gelu="exact"``; ``class_bias=False`` keeps the patch bias off the class token, as HF's
``ViTEmbeddings`` (the form :mod:`colossal_jax.hf.vit` imports).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers import MLP, Dense, Embed, FeatureEmbed, LayerNorm, SelfAttention, Stack
from colossal_jax.layers.model import SequenceModel
from colossal_jax_models.vit_config import VIT_MODELS, ViTConfig

__all__ = ["VIT_MODELS", "Block", "ViT", "ViTConfig"]

CLASS_POSITION = 0
"""The class token's position (the images' row 0)."""


class Block(nnx.Module):
    """One pre-LN encoder layer: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.ln1 = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.attn = SelfAttention(cfg.n_embd, cfg.n_head, rngs=rngs, causal=cfg.causal)
        self.ln2 = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.mlp = MLP(cfg.n_embd, cfg.mlp_width, rngs=rngs, approximate=cfg.gelu == "tanh")

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), positions)
        return x + self.mlp(self.ln2(x))


class ViT(SequenceModel):
    """``embed → blocks → head``; ``blocks`` is a :class:`Stack`."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs, unroll: bool | None = None):
        self.cfg = cfg
        h = cfg.n_embd
        if cfg.class_bias:
            self.patch_embed = FeatureEmbed(cfg.patch_dim + 1, h, rngs=rngs)
        else:  # HF's layout: the bias only on patches, the class token a row of its own
            self.patch_embed = FeatureEmbed(cfg.patch_dim, h, rngs=rngs, use_bias=False)
            self.patch_bias = FeatureEmbed(1, h, rngs=rngs, use_bias=False, init_std=0.0)
            self.class_token = FeatureEmbed(1, h, rngs=rngs, use_bias=False)
        self.wpe = Embed(cfg.block_size, h, rngs=rngs)
        self.blocks = Stack(lambda r: Block(cfg, rngs=r), cfg.n_layer, rngs=rngs, unroll=unroll)
        self.ln_f = LayerNorm(h, eps=cfg.eps)
        self.head = Dense(h, cfg.vocab_size, kind="in", rngs=rngs, init_std=0.0)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Patch (and class-token) embeddings plus learned positions: ``tokens: [b, s,
        patch_dim]`` pixels, ``positions: [b, s]`` -> ``[b, s, h]``."""
        is_class = (positions == CLASS_POSITION)[..., None].astype(tokens.dtype)
        if not self.cfg.class_bias:
            patches = self.patch_embed(tokens * (1 - is_class)) + self.patch_bias(1 - is_class)
            return patches + self.class_token(is_class) + self.wpe(positions)
        inputs = jnp.concatenate([tokens * (1 - is_class), is_class], axis=-1)
        return self.patch_embed(inputs) + self.wpe(positions)

    def logits(self, x: jax.Array) -> jax.Array:
        """Class logits ``[b, s, vocab_size]`` (the first ``num_classes`` are the classes)."""
        return self.head(self.ln_f(x))
