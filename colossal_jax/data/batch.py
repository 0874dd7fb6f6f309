"""The batch every task returns, and the token-corpus batches that causal and masked LM share.

A batch is a dict of numpy arrays ``tokens, targets, positions, weights``, each ``[b, s]`` (image
``tokens`` carry a trailing feature dimension). Positions count ``0..s-1`` in every sequence; a
``layout_order`` (a permutation of ``range(s)``, e.g. the zigzag order of ring attention) lays all
four out in that order along the sequence, so the positions travel with their tokens.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np


def sequence_batch(
    tokens: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    layout_order: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The batch of ``tokens``, ``targets`` and loss ``weights`` (``[b, s]``) with positions
    ``0..s-1``, all four permuted along the sequence by ``layout_order`` when it is given."""
    b, s = weights.shape
    out = {
        "tokens": tokens,
        "targets": targets,
        "positions": np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy(),
        "weights": weights,
    }
    if layout_order is not None:
        out = {k: np.ascontiguousarray(v[:, layout_order]) for k, v in out.items()}
    return out


@dataclass(frozen=True)
class Corpus:
    """A token stream and its vocabulary size (``tokens is None`` for synthetic data)."""

    name: str
    tokens: np.ndarray | None
    vocab_size: int | None


@dataclass(frozen=True)
class CorpusBatches(abc.ABC):
    """Deterministic, resumable batches of sequences cut from a token corpus.

    ``batch(step)`` is a pure function of ``(seed, step)``. Subclasses say how many corpus tokens
    a sequence reads (:attr:`corpus_tokens_per_sequence`) and build the batch.

    Attributes:
      corpus: the token stream (``tokens is None``: uniform random tokens).
      batch_size, seq_len: the batch's ``[b, s]``.
      seed: with the step, seeds every random choice of a batch.
      vocab_size: the model's vocabulary.
      layout_order: a permutation of ``range(seq_len)`` applied to every array, or None.
    """

    corpus: Corpus
    batch_size: int
    seq_len: int
    seed: int
    vocab_size: int
    layout_order: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.corpus.name

    @property
    def caveat(self) -> str | None:
        """Nothing the summary line must repeat about a token corpus."""
        return None

    @property
    @abc.abstractmethod
    def corpus_tokens_per_sequence(self) -> int:
        """Tokens of the corpus one sequence of the batch reads."""

    @abc.abstractmethod
    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The batch of training step ``step`` (see :func:`sequence_batch`)."""

    def evaluation_batches(self, requested: int) -> int:
        """Held-out batches an evaluation averages: as many as asked (``eval_batches``)."""
        return requested

    def epochs(self, steps: int) -> str | None:
        """A note when ``steps`` read more tokens than the corpus holds, else None."""
        toks = self.corpus.tokens
        read = steps * self.batch_size * self.corpus_tokens_per_sequence
        if toks is None or read <= len(toks):
            return None
        return (
            f"the run reads {read:,} training tokens but the training split of "
            f"{self.corpus.name} holds {len(toks):,}: about {read / len(toks):.1f} epochs "
            "(sequences repeat)"
        )
