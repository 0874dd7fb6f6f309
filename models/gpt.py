"""GPT-2 / GPT-3 family (Radford et al. 2019; Brown et al. 2020), written once.

Built only from the library's layers: the same file trains under data, tensor (1D/2D/2.5D/3D) and
sequence parallelism, because each layer routes to the active layout. Differences from GPT-2: the
LM head is not tied to the token embedding (tying would force one layout on two different uses of
one table), and positions are an explicit input, so a sequence split and reordered over devices
(zigzag ring attention) keeps every token's true position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from colossal_jax.layers import MLP, Dense, Embed, LayerNorm, SelfAttention, Stack
from colossal_jax.layers.core import token_loss_sums


@dataclass(frozen=True)
class GPTConfig:
    """Architecture.

    Attributes:
      vocab_size: token ids are ``[0, vocab_size)``.
      block_size: the longest sequence (rows of the learned position table).
      n_layer, n_head, n_embd: depth, attention heads, hidden size.
      mlp_ratio: MLP width = ``mlp_ratio · n_embd``.
      eps: layer-norm epsilon.
      position: ``learned`` (GPT-2's position table) or ``rope`` (rotary, no table).
      rope_theta: RoPE base frequency.
    """

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_ratio: int = 4
    eps: float = 1e-5
    position: str = "learned"
    rope_theta: float = 10000.0

    def __post_init__(self):
        if self.position not in ("learned", "rope"):
            raise ValueError(f"model.position {self.position!r} is not one of learned, rope")

    @property
    def mlp_width(self) -> int:
        return self.mlp_ratio * self.n_embd

    def matmul_params(self) -> int:
        """Parameters in matmuls (every linear and the LM head), the N of ``6·N`` FLOPs."""
        h, w = self.n_embd, self.mlp_width
        return self.n_layer * (4 * h * h + 2 * h * w) + h * self.vocab_size

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·s·h`` (docs/formulas.md), counting the full
        attention score matrix (no causal halving, since the kernels compute masked blocks too)."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layer * seq_len * self.n_embd


def _gpt2(n_layer: int, n_head: int, n_embd: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=1024)


def _gpt3(n_layer: int, n_head: int, n_embd: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=2048)


MODELS: dict[str, GPTConfig] = {
    "gpt2-tiny": GPTConfig(vocab_size=256, block_size=256, n_layer=2, n_head=8, n_embd=128),
    "gpt2-small": _gpt2(12, 12, 768),
    "gpt2-medium": _gpt2(24, 16, 1024),
    "gpt2-large": _gpt2(36, 20, 1280),
    "gpt2-xl": _gpt2(48, 25, 1600),
    "gpt3-small": _gpt3(12, 12, 768),
    "gpt3-medium": _gpt3(24, 16, 1024),
    "gpt3-large": _gpt3(24, 16, 1536),
    "gpt3-xl": _gpt3(24, 16, 2048),
    "gpt3-2.7b": _gpt3(32, 32, 2560),
    "gpt3-6.7b": _gpt3(32, 32, 4096),
    "gpt3-13b": _gpt3(40, 40, 5120),
    "gpt3-175b": _gpt3(96, 96, 12288),
}


def model_config(name: str, **overrides) -> GPTConfig:
    """The named config with field overrides; ``KeyError`` names the valid models."""
    if name not in MODELS:
        raise KeyError(f"--model {name!r} is unknown; choose one of {', '.join(MODELS)}")
    return dataclasses.replace(MODELS[name], **overrides)


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


class GPT(nnx.Module):
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
            x = x + self.wpe(positions)
        return x

    def logits(self, x: jax.Array) -> jax.Array:
        return self.lm_head(self.ln_f(x))

    def head_loss(
        self, x: jax.Array, targets: jax.Array, weights: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``(sum of weighted token losses, sum of weights)`` of the stack's output ``x``."""
        return token_loss_sums(self.logits(x), targets, weights)

    def __call__(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Logits ``[b, s, vocab]`` for token ids and their positions, both ``[b, s]``."""
        return self.logits(self.blocks(self.embed(tokens, positions), positions))

    def loss(
        self, tokens: jax.Array, positions: jax.Array, targets: jax.Array, weights: jax.Array
    ) -> jax.Array:
        """Mean next-token cross-entropy over tokens with nonzero ``weights``."""
        x = self.blocks(self.embed(tokens, positions), positions)
        total, count = self.head_loss(x, targets, weights)
        return total / jnp.maximum(count, 1.0)


def count_params(state) -> int:
    return sum(int(jnp.size(x)) for x in jax.tree.leaves(state))
