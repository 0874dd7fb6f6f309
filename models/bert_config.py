"""BERT architectures (Devlin et al. 2019, arXiv 1810.04805) as plain data: :class:`BertConfig`
and the named sizes :data:`BERT_MODELS` (registered in :mod:`colossal_jax_models.registry`).

Nothing here imports JAX or Flax. ``vocab_size`` is the paper's WordPiece vocabulary (30,522)
until a run sizes it for its data: the masked-LM task of the embedded corpus has 256 byte tokens
and 4 special tokens, padded to 320 (:mod:`colossal_jax.data.masked_lm`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BertConfig:
    """Architecture.

    Attributes:
      vocab_size: token ids are ``[0, vocab_size)`` (the special tokens included).
      block_size: the longest sequence (rows of the learned position table).
      n_layer, n_head, n_embd: depth, attention heads, hidden size.
      mlp_ratio: MLP width = ``mlp_ratio · n_embd``.
      type_vocab_size: rows of the token-type (segment) embedding; 0: none. A token's type is the
        number of ``[SEP]`` tokens before it in its sequence (0 for the first segment, 1 for the
        second), so it needs the whole sequence on every device (no ``seq`` split).
      eps: layer-norm epsilon (the paper's 1e-12).
      gelu: the GeLU of the MLP and of the MLM transform, ``"tanh"`` (approximation) or
        ``"exact"`` (erf, the paper's and HF's ``"gelu"``).
      sep_token: the ``[SEP]`` id that token types count; ``None``: the last four ids of the
        vocabulary are the special tokens (:mod:`colossal_jax.data.masked_lm`) and ``[SEP]`` is the
        second of them. A WordPiece vocabulary's is 102 (``--set model.sep_token=102``).
    """

    vocab_size: int = 30522
    block_size: int = 512
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_ratio: int = 4
    type_vocab_size: int = 2
    eps: float = 1e-12
    gelu: str = "tanh"
    sep_token: int | None = None

    def __post_init__(self):
        if self.gelu not in ("tanh", "exact"):
            raise ValueError(f"model.gelu={self.gelu!r} is not one of ('tanh', 'exact')")

    position = "learned"
    """Positions come from a learned table (``block_size`` rows)."""
    causal = False
    """Attention sees every position (an encoder;
    :func:`colossal_jax.config.parallel_rules.is_causal`)."""

    @property
    def mlp_width(self) -> int:
        return self.mlp_ratio * self.n_embd

    def matmul_params(self) -> int:
        """Parameters in matmuls (every linear, the MLM transform and decoder, whose matmul runs
        though its weights are the token embedding's), the N of ``6·N`` FLOPs."""
        h, w = self.n_embd, self.mlp_width
        return self.n_layer * (4 * h * h + 2 * h * w) + h * h + h * self.vocab_size

    def param_count(self) -> int:
        """Parameters of ``colossal_jax_models.bert.Bert(self)``: token, position and type
        embeddings with
        their layer norm, the post-LN layers, the MLM decoder's bias (its weights are the
        token embedding's) and its transform (dense and layer norm)."""
        h, w, v = self.n_embd, self.mlp_width, self.vocab_size
        layer = 4 * h * h + 4 * h + 2 * h * w + w + h + 4 * h  # attention, MLP, two layer norms
        embeddings = (v + self.block_size + self.type_vocab_size) * h + 2 * h
        transform = h * h + h + 2 * h
        return embeddings + self.n_layer * layer + transform + v

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·s·h`` (docs/formulas.md); the decoder runs on
        every position (the loss weights pick the masked ones)."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layer * seq_len * self.n_embd


BERT_MODELS: dict[str, BertConfig] = {
    # ours, CPU-sized (Google's later "BERT-Tiny" is L=2 H=128 A=2); 8 heads, as gpt2-tiny, so
    # every tensor split of 8 devices divides them
    "bert-tiny": BertConfig(block_size=128, n_layer=2, n_head=8, n_embd=128, type_vocab_size=0),
    "bert-base": BertConfig(n_layer=12, n_head=12, n_embd=768),
    "bert-large": BertConfig(n_layer=24, n_head=16, n_embd=1024),
}
