"""GPT-2 / GPT-3 architectures as plain data: :class:`GPTConfig` and the named sizes
:data:`GPT_MODELS` (registered in :mod:`colossal_jax_models.registry`).

Nothing here imports JAX or Flax, so the command line can size a model and check every
configuration rule (:mod:`colossal_jax.config`) before JAX starts.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def param_count(self) -> int:
        """Parameters of ``colossal_jax_models.gpt.GPT(self)``: embeddings, layers (with biases and
        layer
        norms), the final norm and the untied LM head."""
        h, w, v = self.n_embd, self.mlp_width, self.vocab_size
        layer = 4 * h * h + 4 * h + 2 * h * w + w + h + 4 * h  # attention, MLP, two layer norms
        positions = self.block_size * h if self.position == "learned" else 0
        return v * h + positions + self.n_layer * layer + 2 * h + h * v

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·s·h`` (docs/formulas.md), counting the full
        attention score matrix (no causal halving, since the kernels compute masked blocks too)."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layer * seq_len * self.n_embd


def _gpt2(n_layer: int, n_head: int, n_embd: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=1024)


def _gpt3(n_layer: int, n_head: int, n_embd: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=2048)


GPT_MODELS: dict[str, GPTConfig] = {
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
