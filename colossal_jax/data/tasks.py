"""The data task of each model family (:data:`colossal_jax_models.registry.TASKS`): how the data
sizes the
model and which batches a run reads.

- ``causal_lm``: next-token prediction on a token corpus
(:class:`colossal_jax.data.corpus.Batches`);
  the model's vocabulary is the corpus's.
- ``masked_lm``: BERT's masked tokens on a token corpus
  (:class:`colossal_jax.data.masked_lm.MaskedBatches`); the vocabulary is the corpus's plus four
  special tokens, padded to a multiple of 64.
- ``image_classification``: images as patch tokens (:class:`colossal_jax.data.images.ImageBatches`);
  the data fits the model (the rules check it), not the other way round.

Every task's batches are dicts of ``tokens, targets, positions, weights`` (``[b, s]``; image
``tokens`` carry a trailing feature dimension), a pure function of ``(seed, step)``, held-out data
kept apart. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from colossal_jax.config import TrainConfig
from colossal_jax.data.corpus import (
    BYTE_VOCAB,
    Batches,
    Corpus,
    load_corpus,
    split_corpus,
    vocab_of,
)


class TaskBatches(Protocol):
    """What a run needs of any task's batches."""

    batch_size: int

    @property
    def name(self) -> str: ...

    def batch(self, step: int) -> dict[str, np.ndarray]: ...

    def evaluation_batches(self, requested: int) -> int: ...

    def epochs(self, steps: int) -> str | None: ...

    @property
    def caveat(self) -> str | None:
        """What the run's summary line repeats about the data (generated images standing in
        for the digits), or None."""
        ...


def model_vocab(task: str, data_vocab: int | None) -> int | None:
    """The vocabulary a corpus of ``data_vocab`` token ids gives the model (None: the data does
    not size it)."""
    if data_vocab is None or task == "image_classification":
        return None
    if task == "masked_lm":
        from colossal_jax.data.masked_lm import vocab_size_for

        return vocab_size_for(data_vocab)
    return data_vocab


def data_vocab(task: str, spec: str) -> int | None:
    """The token ids of ``--data spec`` for ``task`` (None for images and synthetic tokens)."""
    return None if task == "image_classification" else vocab_of(spec)


def sized_for_default_data(task: str, model: Any) -> Any:
    """``model`` sized as a run with the default data (``--data stdlib``, 256 byte tokens) sizes
    it; image models as they are."""
    vocab = model_vocab(task, BYTE_VOCAB)
    return model if vocab is None else dataclasses.replace(model, vocab_size=vocab)


def load_text(task: str, spec: str) -> Corpus | None:
    """The token corpus of a text task (None for images, whose data fits the model)."""
    return None if task == "image_classification" else load_corpus(spec)


def make_batches(
    cfg: TrainConfig,
    task: str,
    model: Any,
    corpus: Corpus | None,
    order: np.ndarray | None = None,
) -> tuple[TaskBatches, TaskBatches | None, str | None]:
    """``(training batches, held-out batches or None, a note or None)`` of ``task``.

    ``corpus`` is :func:`load_text`'s; ``order`` a permutation of the sequence (ring
    attention's zigzag) applied to every array of every batch."""
    b, s, seed = cfg.batch_size, cfg.seq_len, cfg.seed
    if task == "image_classification":
        from colossal_jax.data.images import (
            STAND_IN,
            ImageBatches,
            load_images,
            spec_stands_in,
            split,
        )

        source, note = load_images(cfg.data, model.image_size, model.channels, model.num_classes)
        train_idx, held_idx = split(source)
        p = model.patch_size
        caveat = STAND_IN if spec_stands_in(cfg.data, note) else None
        train = ImageBatches(source, train_idx, b, seed, p, layout_order=order, caveat=caveat)
        held = ImageBatches(source, held_idx, b, seed, p, ordered=True, layout_order=order)
        return train, held, note
    assert corpus is not None
    train_corpus, held_out = split_corpus(corpus, s)
    if task == "masked_lm":
        from colossal_jax.data.masked_lm import MaskedBatches

        def make(c: Corpus) -> TaskBatches:
            return MaskedBatches(c, b, s, seed, model.vocab_size, order)
    else:

        def make(c: Corpus) -> TaskBatches:
            return Batches(c, b, s, seed, model.vocab_size, order)

    note = None
    if held_out is None and corpus.tokens is not None and cfg.eval_every:
        n, fits = len(corpus.tokens), (len(corpus.tokens) - 3) // 2
        shorter = f"; --seq-len {fits} or less would hold some out" if fits >= 2 else ""
        note = (
            f"--data {cfg.data} holds {n:,} tokens, too few to hold out a sequence for "
            f"evaluation beside training at --seq-len {s} (that needs at least {2 * s + 3:,}): "
            f"the run trains on all of them and does not evaluate{shorter}"
        )
    return make(train_corpus), (make(held_out) if held_out is not None else None), note
