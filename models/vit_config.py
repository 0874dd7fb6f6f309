"""Vision Transformer architectures (Dosovitskiy et al. 2021, arXiv 2010.11929) as plain data:
:class:`ViTConfig` and the named sizes :data:`VIT_MODELS` (registered in
:mod:`colossal_jax_models.registry`).

Nothing here imports JAX or Flax. An image of ``image_size²`` pixels and ``channels`` channels
is cut into ``(image_size / patch_size)²`` patches; with the class token in front, that is the
sequence a run trains on (``--seq-len`` must equal :attr:`ViTConfig.seq_len`).
"""

from __future__ import annotations

from dataclasses import dataclass

GELUS = ("tanh", "exact")
"""The MLP's GeLU forms (``jax.nn.gelu(approximate=...)``)."""
TABLE_MULTIPLE = 16
"""The position table's rows and the head's outputs are padded to a multiple of this, so every
tensor split up to 16 ways divides them (unused rows and logits: never looked up, never a
target), as GPT's vocabulary is padded to 50,304."""


def _round_up(n: int, multiple: int = TABLE_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class ViTConfig:
    """Architecture.

    Attributes:
      image_size: height = width of the input images, in pixels.
      patch_size: side of a square patch; must divide ``image_size``.
      channels: colour channels of a pixel.
      num_classes: classes of the classification head.
      n_layer, n_head, n_embd: depth, attention heads, hidden size.
      mlp_ratio: MLP width = ``mlp_ratio · n_embd``.
      eps: layer-norm epsilon (1e-6 as the paper's code).
      gelu: the MLP's GeLU, ``"tanh"`` (approximation) or ``"exact"`` (erf, as HF's ``"gelu"``).
      class_bias: the patch embedding's bias is added at the class token's slot too (ours);
        False: only to the patches, as HF's ``ViTEmbeddings`` (the bias and the class token are
        then one-row embeddings of their own, so an imported HF ViT is exact).
    """

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 1000
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_ratio: int = 4
    eps: float = 1e-6
    gelu: str = "tanh"
    class_bias: bool = True

    def __post_init__(self):
        if self.gelu not in GELUS:
            raise ValueError(f"model.gelu={self.gelu!r} is not one of {GELUS}; use 'tanh'")

    position = "learned"
    """Positions come from a learned table (``block_size`` rows)."""
    causal = False
    """Attention sees every position (an encoder;
    :func:`colossal_jax.config.parallel_rules.is_causal`)."""

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def seq_len(self) -> int:
        """Tokens per image: the patches and the class token (position 0)."""
        return self.n_patches + 1

    @property
    def patch_dim(self) -> int:
        """Inputs of the patch embedding: ``patch_size² · channels`` pixel values."""
        return self.patch_size * self.patch_size * self.channels

    @property
    def block_size(self) -> int:
        """Rows of the learned position table: :attr:`seq_len` padded to a multiple of 16."""
        return _round_up(self.seq_len)

    @property
    def vocab_size(self) -> int:
        """Outputs of the head: ``num_classes`` padded to a multiple of 16 (the wide dimension
        the tensor modes split, as a vocabulary)."""
        return _round_up(self.num_classes)

    @property
    def mlp_width(self) -> int:
        return self.mlp_ratio * self.n_embd

    def matmul_params(self) -> int:
        """Parameters in matmuls (patch embedding, every linear, the head), the N of ``6·N``."""
        h, w = self.n_embd, self.mlp_width
        # the pixels of a patch, the class-token indicator (and the patches' when not class_bias)
        inputs = self.patch_dim + (1 if self.class_bias else 2)
        return inputs * h + self.n_layer * (4 * h * h + 2 * h * w) + h * self.vocab_size

    def param_count(self) -> int:
        """Parameters of ``colossal_jax_models.vit.ViT(self)``: patch embedding (its last input row
        is the
        class token), position table, pre-LN layers, the final norm and the head."""
        h, w = self.n_embd, self.mlp_width
        layer = 4 * h * h + 4 * h + 2 * h * w + w + h + 4 * h  # attention, MLP, two layer norms
        embeddings = (self.patch_dim + 1) * h + h + self.block_size * h
        return embeddings + self.n_layer * layer + 2 * h + h * self.vocab_size + self.vocab_size

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·s·h`` (docs/formulas.md), the head on every
        token as it runs; per image, times :attr:`seq_len`."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layer * seq_len * self.n_embd


VIT_MODELS: dict[str, ViTConfig] = {
    # ours, CPU-sized: the 8×8 digits in four 4×4 patches and the class token (2×2 patches
    # learn far slower on 1,437 training images: 83% held out after 300 steps against 97%)
    "vit-tiny": ViTConfig(
        image_size=8, patch_size=4, channels=1, num_classes=10, n_layer=4, n_head=8, n_embd=64
    ),
    "vit-base": ViTConfig(n_layer=12, n_head=12, n_embd=768),
    "vit-large": ViTConfig(n_layer=24, n_head=16, n_embd=1024),
    "vit-huge": ViTConfig(patch_size=14, n_layer=32, n_head=16, n_embd=1280),
}
