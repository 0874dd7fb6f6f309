"""LLaMA architectures (Touvron et al. 2023, arXiv 2302.13971 and 2307.09288; Llama 3, Grattafiori
et al. 2024, arXiv 2407.21783) as plain data: :class:`LlamaConfig` and the named
:data:`LLAMA_MODELS`.

Nothing here imports JAX or Flax, so configuration rules (:mod:`colossal_jax.config`) and memory
estimates can read a config before JAX starts. Field names are GPTConfig's where they mean the
same (``vocab_size, block_size, n_layer, n_head, n_embd, eps, rope_theta``, ``mlp_width``,
``matmul_params()``, ``flops_per_token()``); :mod:`colossal_jax_models.llama` builds the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    """Architecture.

    Attributes:
      vocab_size: token ids are ``[0, vocab_size)``.
      block_size: the longest sequence (the published context length; RoPE has no table).
      n_layer, n_head, n_embd: depth, query heads, hidden size (head size ``n_embd/n_head``).
      n_kv_head: key/value heads (grouped-query attention; ``n_head`` is multi-head attention).
      intermediate_size: the SwiGLU width (exact, e.g. 11008 for Llama-2-7B).
      eps: RMSNorm epsilon.
      rope_theta: RoPE base frequency (10⁴ in Llama 2, 5·10⁵ in Llama 3).
      tie_embeddings: the LM head reuses the token-embedding table.
    """

    vocab_size: int = 32000
    block_size: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 32
    n_embd: int = 4096
    intermediate_size: int = 11008
    eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self):
        for key in (
            "vocab_size",
            "block_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "intermediate_size",
        ):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{key}={value} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}"
            )
        if self.n_head % self.n_kv_head:
            fits = [d for d in range(1, self.n_head + 1) if self.n_head % d == 0]
            raise ValueError(
                f"model.n_kv_head={self.n_kv_head} does not divide model.n_head={self.n_head}; "
                f"use one of {fits}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"RoPE needs an even head size, but n_embd/n_head = {self.head_dim}; use "
                f"model.n_embd={self.n_embd + self.n_head}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_width(self) -> int:
        return self.intermediate_size

    @property
    def position(self) -> str:
        """Positions enter through RoPE only (no learned table), as GPTConfig's ``"rope"``."""
        return "rope"

    @property
    def causal(self) -> bool:
        return True

    def matmul_params(self) -> int:
        """Parameters in matmuls (every linear and the LM head, tied or not: the head's matmul
        runs either way), the N of ``6·N`` FLOPs."""
        h, w, kv = self.n_embd, self.mlp_width, self.n_kv_head * self.head_dim
        return self.n_layer * (2 * h * h + 2 * h * kv + 3 * h * w) + h * self.vocab_size

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·s·h`` (docs/formulas.md); grouped-query
        attention shares K/V heads but every query head still scores ``s`` keys."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layer * seq_len * self.n_embd

    def param_count(self) -> int:
        """Parameters of ``colossal_jax_models.llama.Llama``: token embedding, layers (no biases;
        two RMSNorm
        scales each), the final RMSNorm and the LM head unless tied."""
        h, w, kv = self.n_embd, self.mlp_width, self.n_kv_head * self.head_dim
        layer = 2 * h * h + 2 * h * kv + 3 * h * w + 2 * h
        head = 0 if self.tie_embeddings else h * self.vocab_size
        return self.vocab_size * h + self.n_layer * layer + h + head


def _llama2(n_layer: int, n_head: int, n_kv_head: int, n_embd: int, width: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000,
        block_size=4096,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_embd=n_embd,
        intermediate_size=width,
        eps=1e-5,
        rope_theta=10000.0,
    )


def _llama3(n_layer: int, n_head: int, n_embd: int, width: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        block_size=8192,
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=8,
        n_embd=n_embd,
        intermediate_size=width,
        eps=1e-5,
        rope_theta=500000.0,
    )


LLAMA_MODELS: dict[str, LlamaConfig] = {
    # CPU-sized: byte vocabulary, 2 layers, 16 query heads sharing 8 key/value heads (every
    # tensor split of 8 devices divides both)
    "llama-tiny": LlamaConfig(
        vocab_size=256,
        block_size=256,
        n_layer=2,
        n_head=16,
        n_kv_head=8,
        n_embd=128,
        intermediate_size=384,
        eps=1e-5,
        rope_theta=10000.0,
    ),
    # the published sizes (Hugging Face config.json of each checkpoint)
    "llama2-7b": _llama2(32, 32, 32, 4096, 11008),
    "llama2-13b": _llama2(40, 40, 40, 5120, 13824),
    "llama2-70b": _llama2(80, 64, 8, 8192, 28672),
    "llama3-8b": _llama3(32, 32, 4096, 14336),
    "llama3-70b": _llama3(80, 64, 8192, 28672),
}


def llama_config(name: str, **overrides) -> LlamaConfig:
    """The named LLaMA config with fields replaced (``KeyError`` naming the choices)."""
    if name not in LLAMA_MODELS:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(LLAMA_MODELS)}")
    return dataclasses.replace(LLAMA_MODELS[name], **overrides)
