"""Masked language modelling data (BERT, Devlin et al. 2019, section 3.1) on any token corpus.

Each sequence is ``[CLS] A [SEP] B [SEP]``: a window of the corpus cut at a random point into two
segments. 15% of its text tokens (rounded, at least one) are chosen; of those, 80% become
``[MASK]``, 10% a random text token and 10% stay as they are. The targets are the original
tokens and the loss weight is 1 at the chosen positions only, so the model is scored on exactly
the tokens BERT predicts.

Vocabulary: the corpus's ids ``[0, n)`` (256 bytes for text), then unused ids, then the four
special tokens ``[CLS] [SEP] [MASK] [PAD]`` as the *last* four ids of the model's vocabulary,
which is ``n + 4`` rounded up to a multiple of 64 (320 for bytes: every tensor split up to 64
ways divides it). Special ids are therefore a function of the model's vocabulary alone, so the
model finds ``[SEP]`` (its segments) without knowing the data. ``[PAD]`` is in the vocabulary
for completeness; these sequences are never padded.

Batches are a pure function of ``(seed, step)`` — windows, cut points and masks alike — so a run
resumed at step ``k`` sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from colossal_jax.config import ConfigError
from colossal_jax.data.batch import CorpusBatches, sequence_batch

SPECIALS = ("[CLS]", "[SEP]", "[MASK]", "[PAD]")
VOCAB_MULTIPLE = 64
MASK_RATE = 0.15
"""Share of a sequence's text tokens that are predicted."""
MASK_SPLIT = (0.8, 0.1, 0.1)
"""Of the predicted tokens: replaced by ``[MASK]``, by a random token, left unchanged."""


def vocab_size_for(n_regular: int) -> int:
    """The model vocabulary for a corpus of ``n_regular`` token ids: room for the 4 special
    tokens, rounded up to a multiple of :data:`VOCAB_MULTIPLE`."""
    return -(-(n_regular + len(SPECIALS)) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of ``[CLS] [SEP] [MASK] [PAD]``: the last four of a vocabulary."""

    cls: int
    sep: int
    mask: int
    pad: int

    @classmethod
    def of(cls, vocab_size: int) -> SpecialTokens:
        first = vocab_size - len(SPECIALS)
        return cls(first, first + 1, first + 2, first + 3)


@dataclass(frozen=True)
class MaskedBatches(CorpusBatches):
    """Deterministic, resumable masked-LM batches.

    ``batch(step)`` returns numpy arrays ``[batch_size, seq_len]``: ``tokens`` (the masked
    input), ``targets`` (the original tokens), ``positions`` and ``weights`` (1.0 at the
    predicted positions, 0 elsewhere). With a ``layout_order`` (ring attention's zigzag) all four
    are laid out in that order along the sequence.

    Attributes:
      corpus: the token stream (``tokens is None``: uniform random text tokens).
      vocab_size: the model's vocabulary (special tokens are its last four ids).
    """

    def __post_init__(self):
        n = self.n_regular
        if n + len(SPECIALS) > self.vocab_size:
            need = vocab_size_for(n)
            raise ConfigError(
                f"masked LM on {self.corpus.name} needs {n} token ids and {len(SPECIALS)} special "
                f"tokens, more than --set model.vocab_size={self.vocab_size}; use --set "
                f"model.vocab_size={need}"
            )
        toks = self.corpus.tokens
        text = self.corpus_tokens_per_sequence
        if toks is not None and len(toks) < text + 1:
            raise ConfigError(
                f"the corpus {self.corpus.name} has {len(toks)} tokens, fewer than the "
                f"{text} text tokens of a --seq-len {self.seq_len} sequence; use a shorter "
                "--seq-len or a longer file"
            )

    @property
    def corpus_tokens_per_sequence(self) -> int:
        """The text tokens of a sequence: all but ``[CLS] A [SEP] B [SEP]``'s three specials."""
        return self.seq_len - 3

    @property
    def n_regular(self) -> int:
        """Corpus token ids: ``[0, n_regular)``."""
        if self.corpus.vocab_size is not None:
            return self.corpus.vocab_size
        return self.vocab_size - len(SPECIALS)

    @property
    def specials(self) -> SpecialTokens:
        return SpecialTokens.of(self.vocab_size)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        b, s = self.batch_size, self.seq_len
        text = self.corpus_tokens_per_sequence
        if self.corpus.tokens is None:
            window = rng.integers(0, self.n_regular, size=(b, text), dtype=np.int64)
        else:
            starts = rng.integers(0, len(self.corpus.tokens) - text + 1, size=b)
            window = self.corpus.tokens[starts[:, None] + np.arange(text)[None, :]]
        cut = rng.integers(1, text, size=b)  # A = window[:cut], B = window[cut:], both non-empty
        sp = self.specials
        seqs = np.empty((b, s), np.int64)
        seqs[:, 0] = sp.cls
        seqs[:, -1] = sp.sep
        col = np.arange(text)[None, :]
        body = np.where(col < cut[:, None], col + 1, col + 2)  # where each text token goes
        rows = np.arange(b)[:, None]
        seqs[rows, body] = window
        seqs[np.arange(b), cut + 1] = sp.sep

        # choose round(15%) of the text tokens of each sequence (at least one)
        k = max(1, round(MASK_RATE * text))
        chosen_text = np.argsort(rng.random((b, text)), axis=1)[:, :k]
        chosen = np.take_along_axis(body, chosen_text, axis=1)
        weights = np.zeros((b, s), np.float32)
        weights[rows, chosen] = 1.0
        inputs = seqs.copy()
        u = rng.random((b, k))
        as_mask = u < MASK_SPLIT[0]
        as_random = (u >= MASK_SPLIT[0]) & (u < MASK_SPLIT[0] + MASK_SPLIT[1])
        random_ids = rng.integers(0, self.n_regular, size=(b, k))
        picked = inputs[rows, chosen]
        picked = np.where(as_mask, sp.mask, np.where(as_random, random_ids, picked))
        inputs[rows, chosen] = picked
        return sequence_batch(
            inputs.astype(np.int32), seqs.astype(np.int32), weights, self.layout_order
        )
