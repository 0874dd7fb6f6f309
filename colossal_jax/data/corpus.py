"""Training data: an embedded default corpus, a byte-level tokenizer, user files, synthetic tokens.

The default corpus needs no download: it is the source of the Python standard library of the
running interpreter (read from disk in a fixed order). Batches are a pure function of
``(seed, step)``, so a run resumed at step ``k`` sees exactly the batches an uninterrupted run
would; the checkpointed data position is the step itself.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from colossal_jax.config import ConfigError
from colossal_jax.data.batch import Corpus, CorpusBatches, sequence_batch

BYTE_VOCAB = 256
DEFAULT_CORPUS_BYTES = 4 * 2**20


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level tokenizer: UTF-8 bytes are the token ids (vocabulary 256)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


def decode(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def stdlib_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES) -> bytes:
    """The Python standard library's own ``.py`` sources, sorted by path, up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    corpus = b"\n".join(chunks)[:max_bytes]
    if len(corpus) < 1024:
        raise ConfigError(f"the standard library at {root} is too small to train on")
    return corpus


def load_corpus(spec: str) -> Corpus:
    """``stdlib`` (default, embedded), ``synthetic``, a ``.npy`` token file, or a text file."""
    if spec == "stdlib":
        return Corpus("python-stdlib", encode(stdlib_corpus()), BYTE_VOCAB)
    if spec == "synthetic":
        return Corpus("synthetic", None, None)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"--data {spec!r} is not a file; use stdlib, synthetic, a text file or a .npy file"
        )
    if path.suffix == ".npy":
        tokens = _npy_tokens(spec, path)
        return Corpus(path.name, tokens, int(tokens.max()) + 1)
    if path.suffix in BINARY_SUFFIXES:
        raise ConfigError(
            f"--data {spec}: {path.suffix} files are not read; give a text file or a .npy array "
            "of token ids, e.g. np.save('tokens.npy', np.fromfile(path, dtype=np.uint16))"
        )
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"--data {spec} cannot be read ({e.strerror}); use --data stdlib"
        ) from None
    if not data:
        raise ConfigError(
            f"--data {spec} is empty; give a text file with more bytes than --seq-len, or "
            "--data stdlib"
        )
    return Corpus(path.name, encode(data), BYTE_VOCAB)


def vocab_of(spec: str) -> int | None:
    """The vocabulary size :func:`load_corpus` would report, without reading a text corpus:
    bytes for ``stdlib`` and text files, None for ``synthetic``, the largest id + 1 of a
    ``.npy`` file (which is read)."""
    if spec == "synthetic":
        return None
    if spec != "stdlib" and Path(spec).suffix == ".npy":
        return load_corpus(spec).vocab_size
    return BYTE_VOCAB


BINARY_SUFFIXES = (".bin", ".npz", ".pt", ".pth", ".safetensors", ".parquet", ".arrow", ".pkl")
_SAVE_HINT = "save token ids with np.save(path, ids.astype(np.int32))"


def _npy_tokens(spec: str, path: Path) -> np.ndarray:
    """The token ids of a ``.npy`` file as int32, or a ConfigError naming what is wrong."""
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
    except (ValueError, OSError, EOFError) as e:
        reason = " ".join(str(e).split())
        raise ConfigError(f"--data {spec} is not a .npy file ({reason}); {_SAVE_HINT}") from None
    if dtype.hasobject or not (
        np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)
    ):
        raise ConfigError(f"--data {spec} holds dtype {dtype}, not integer token ids; {_SAVE_HINT}")
    if len(shape) != 1:
        raise ConfigError(
            f"--data {spec} holds an array of shape {shape}; expected 1-D token ids, "
            "e.g. np.save(path, ids.reshape(-1))"
        )
    if shape[0] == 0:
        raise ConfigError(f"--data {spec} holds no tokens (shape (0,)); {_SAVE_HINT}")
    try:
        raw = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        reason = " ".join(str(e).split())
        raise ConfigError(
            f"--data {spec} is truncated or unreadable ({reason}); {_SAVE_HINT}"
        ) from None
    if np.issubdtype(dtype, np.floating):
        whole = np.isfinite(raw) & (raw == np.floor(raw))
        if not whole.all():
            i = int(np.argmin(whole))
            raise ConfigError(
                f"--data {spec} holds {dtype} values that are not token ids ({raw[i]} at index "
                f"{i}); {_SAVE_HINT}"
            )
    lo, hi = int(raw.min()), int(raw.max())
    if lo < 0:
        i = int(np.argmax(raw < 0))
        raise ConfigError(
            f"--data {spec} has a negative token id {int(raw[i])} at index {i}; token ids must "
            f"be 0 or more (0..vocab_size-1)"
        )
    if hi >= 2**31:
        raise ConfigError(
            f"--data {spec} has token id {hi}, beyond int32; token ids must be below {2**31}"
        )
    return np.asarray(raw, dtype=np.int32)


@dataclass(frozen=True)
class Batches(CorpusBatches):
    """Deterministic, resumable batches of next-token prediction.

    ``batch(step)`` returns numpy arrays ``[batch_size, seq_len]``: ``tokens``, ``targets``
    (tokens shifted by one), ``positions`` and ``weights`` (1.0 for every real token). With a
    ``layout_order`` (a permutation of ``range(seq_len)``, e.g. the zigzag order of ring
    attention) all four are laid out in that order along the sequence.
    """

    def __post_init__(self):
        toks = self.corpus.tokens
        if toks is not None and len(toks) < self.seq_len + 2:
            raise ConfigError(
                f"the corpus {self.corpus.name} has {len(toks)} tokens, fewer than "
                f"--seq-len {self.seq_len} + 2; "
                + (f"use --seq-len {len(toks) - 2} or " if len(toks) >= 4 else "use ")
                + "a longer file"
            )
        if self.corpus.vocab_size is not None and self.corpus.vocab_size > self.vocab_size:
            raise ConfigError(
                f"the data ({self.corpus.name}) has token ids up to {self.corpus.vocab_size - 1} "
                f"but --set model.vocab_size={self.vocab_size}; use --set model.vocab_size="
                f"{self.corpus.vocab_size}"
            )

    @property
    def corpus_tokens_per_sequence(self) -> int:
        return self.seq_len

    def batch(self, step: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        b, s = self.batch_size, self.seq_len
        if self.corpus.tokens is None:
            seqs = rng.integers(0, self.vocab_size, size=(b, s + 1), dtype=np.int32)
        else:
            starts = rng.integers(0, len(self.corpus.tokens) - s - 1, size=b)
            idx = starts[:, None] + np.arange(s + 1)[None, :]
            seqs = self.corpus.tokens[idx]
        return sequence_batch(
            seqs[:, :-1].astype(np.int32),
            seqs[:, 1:].astype(np.int32),
            np.ones((b, s), np.float32),
            self.layout_order,
        )


EVAL_FRACTION = 0.05
"""The share of every token corpus held out for evaluation (its last tokens)."""
EVAL_MIN_SEQUENCES = 4
"""At least this many whole sequences are held out, when the corpus is long enough."""


def split_corpus(
    corpus: Corpus,
    seq_len: int,
    *,
    fraction: float = EVAL_FRACTION,
    min_sequences: int = EVAL_MIN_SEQUENCES,
) -> tuple[Corpus, Corpus | None]:
    """``(train, held_out)``: the last ``fraction`` of the tokens (at least ``min_sequences``
    sequences of ``seq_len + 1`` tokens) are held out and never appear in a training batch.

    The training part keeps at least ``seq_len + 2`` tokens; where the corpus is too short for
    both, or has no tokens (``synthetic``), ``held_out`` is None and the whole corpus trains.
    The vocabulary size of both parts is that of the whole corpus.
    """
    toks = corpus.tokens
    if toks is None:
        return corpus, None
    n = len(toks)
    held = max(math.ceil(fraction * n), min_sequences * (seq_len + 1))
    held = min(held, n - (seq_len + 2))
    if held < seq_len + 1:
        return corpus, None
    boundary = n - held
    train = Corpus(corpus.name, toks[:boundary], corpus.vocab_size)
    return train, Corpus(f"{corpus.name} (held out)", toks[boundary:], corpus.vocab_size)
