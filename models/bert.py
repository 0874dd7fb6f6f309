"""BERT (Devlin et al. 2019, arXiv 1810.04805): a bidirectional encoder trained by masked
language modelling, written once on the library's layers.

Token, learned-position and (optional) token-type embeddings, summed and layer-normed; post-LN
encoder layers (``LN(x + attn(x))``, then ``LN(x + mlp(x))``) whose attention sees every position
(``causal=False``); an MLM decoder tied to the token embedding, with its own bias, as the
paper's, reading the last layer's output through the paper's transform (dense ``h → h``,
GELU, LayerNorm; a :class:`~colossal_jax.layers.HiddenDense`). The loss is scored where the
data's weights are nonzero, the masked positions (:mod:`colossal_jax.data.masked_lm`). Differences
from the paper: GELU is the tanh approximation of the library's MLP unless ``gelu="exact"``;
token types come from the ``[SEP]`` tokens in the sequence (:func:`segments`), not from an
input; no next-sentence head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.data.masked_lm import SpecialTokens
from colossal_jax.layers import (
    MLP,
    Embed,
    FeatureEmbed,
    HiddenDense,
    LayerNorm,
    SelfAttention,
    Stack,
)
from colossal_jax.layers.model import SequenceModel
from colossal_jax_models.bert_config import BERT_MODELS, BertConfig

__all__ = ["BERT_MODELS", "Bert", "BertConfig", "Block", "segments"]


class Block(nnx.Module):
    """One post-LN encoder layer: ``x = LN(x + attn(x))``, then ``x = LN(x + mlp(x))``."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.attn = SelfAttention(cfg.n_embd, cfg.n_head, rngs=rngs, causal=cfg.causal)
        self.ln1 = LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.mlp = MLP(cfg.n_embd, cfg.mlp_width, rngs=rngs, approximate=cfg.gelu == "tanh")
        self.ln2 = LayerNorm(cfg.n_embd, eps=cfg.eps)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        x = self.ln1(x + self.attn(x, positions))
        return self.ln2(x + self.mlp(x))


def segments(tokens: jax.Array, sep: int, types: int) -> jax.Array:
    """Each token's segment: the number of ``[SEP]`` tokens before it (``[CLS] A [SEP]`` is 0,
    ``B [SEP]`` is 1), capped at ``types - 1``. Needs whole sequences in position order."""
    is_sep = (tokens == sep).astype(jnp.int32)
    return jnp.minimum(jnp.cumsum(is_sep, axis=1) - is_sep, types - 1)


class Bert(SequenceModel):
    """``embed → blocks → head``, the parts pipelines, accumulation and remat wrap; ``blocks``
    is a :class:`Stack`."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, unroll: bool | None = None):
        self.cfg = cfg
        h = cfg.n_embd
        self.wte = Embed(cfg.vocab_size, h, rngs=rngs)
        self.wpe = Embed(cfg.block_size, h, rngs=rngs)
        # a one-hot input times a [types, h] matrix: a lookup whose table splits like a weight
        self.wtt = (
            FeatureEmbed(cfg.type_vocab_size, h, rngs=rngs, use_bias=False)
            if cfg.type_vocab_size
            else None
        )
        self.ln_emb = LayerNorm(h, eps=cfg.eps)
        self.blocks = Stack(lambda r: Block(cfg, rngs=r), cfg.n_layer, rngs=rngs, unroll=unroll)
        # the MLM head: transform (dense, GELU, LayerNorm), then the decoder, whose weights are
        # wte's table (tied) and whose bias is split like a wide output
        self.transform = HiddenDense(h, rngs=rngs)
        self.ln_transform = LayerNorm(h, eps=cfg.eps)
        self.decoder_bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32), role="bias_in")

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Token + position (+ token-type) embeddings, layer-normed: ``[b, s, h]``."""
        x = self.wte(tokens) + self.wpe(positions)
        if self.wtt is not None:
            sep = self.cfg.sep_token
            sep = SpecialTokens.of(self.cfg.vocab_size).sep if sep is None else sep
            types = segments(tokens, sep, self.cfg.type_vocab_size)
            x = x + self.wtt(jax.nn.one_hot(types, self.cfg.type_vocab_size, dtype=x.dtype))
        return self.ln_emb(x)

    def logits(self, x: jax.Array) -> jax.Array:
        """``LN(gelu(x @ W + c)) @ wte.T + b``: logits over the vocabulary (wide layout)."""
        y = jax.nn.gelu(self.transform(x), approximate=self.cfg.gelu == "tanh")
        return self.wte.attend(self.ln_transform(y)) + self.decoder_bias[...]
