"""LLaMA (Touvron et al. 2023; Llama 2 and 3), written once from the library's layers.

Pre-norm blocks with RMSNorm (Zhang & Sennrich 2019), rotary positions (RoPE, Su et al. 2021)
inside attention, grouped-query attention (Ainslie et al. 2023; ``n_kv_head`` key/value heads),
the SwiGLU MLP (Shazeer 2020), no biases anywhere, and optionally an LM head tied to the token
embedding. The same file trains under every data, tensor and sequence mode: each layer routes to
the active layout, and positions are an explicit input (negative: padding, never attended to).
Initialisation as the reference implementation's: normal(0.02) for every weight, norms at 1.
"""

from __future__ import annotations

import jax
from flax import nnx

from colossal_jax.layers import Dense, Embed, RMSNorm, SelfAttention, Stack, SwiGLU
from colossal_jax.layers.model import SequenceModel
from colossal_jax_models.llama_config import LLAMA_MODELS, LlamaConfig, llama_config

__all__ = ["Llama", "LlamaBlock", "LlamaConfig", "LLAMA_MODELS", "llama_config"]


class LlamaBlock(nnx.Module):
    """``x + attn(rms(x))``, then ``x + swiglu(rms(x))``."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.n_embd, eps=cfg.eps)
        self.attn = SelfAttention(
            cfg.n_embd,
            cfg.n_head,
            kv_heads=cfg.n_kv_head,
            rngs=rngs,
            rope_theta=cfg.rope_theta,
            causal=True,
            use_bias=False,
        )
        self.mlp_norm = RMSNorm(cfg.n_embd, eps=cfg.eps)
        self.mlp = SwiGLU(cfg.n_embd, cfg.mlp_width, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class Llama(SequenceModel):
    """``embed → blocks → head``, the three parts a pipeline schedule, gradient accumulation and
    remat wrap (the interface of :class:`colossal_jax_models.gpt.GPT`)."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs, unroll: bool | None = None):
        self.cfg = cfg
        self.wte = Embed(cfg.vocab_size, cfg.n_embd, rngs=rngs)
        self.blocks = Stack(
            lambda r: LlamaBlock(cfg, rngs=r), cfg.n_layer, rngs=rngs, unroll=unroll
        )
        self.norm = RMSNorm(cfg.n_embd, eps=cfg.eps)
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else Dense(cfg.n_embd, cfg.vocab_size, kind="in", rngs=rngs, use_bias=False)
        )

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Token embeddings ``[b, s, h]`` (positions enter through RoPE in attention)."""
        del positions
        return self.wte(tokens)

    def logits(self, x: jax.Array) -> jax.Array:
        x = self.norm(x)
        return self.wte.attend(x) if self.lm_head is None else self.lm_head(x)
