"""Image classification data with nothing downloaded, as token batches for a ViT.

Two sources:

- ``digits``: the 1,797 8×8 grey handwritten digits (10 classes) that scikit-learn ships
  (Alpaydin & Kaynak 1998, UCI), pixels scaled to ``[0, 1]``; without scikit-learn installed,
  the generated images below at 8×8×1 with 10 classes stand in (with a note);
- ``shapes``: generated images at any size, channel count and class count: class ``c`` is a
  fixed coarse random pattern (a 4×4 grid per channel, upsampled), every image of it that pattern
  shifted by up to an eighth of the side, at a random contrast, plus Gaussian noise. Images are
  generated from their index, so any size needs no memory beyond a batch.

A fixed permutation (independent of ``--seed``) holds out :data:`HELD_OUT_FRACTION` of the
images; training batches draw from the rest only. A batch is ``[b, s]`` like text, with a
trailing feature dimension on ``tokens``: row 0 is the class token's slot (zeros), rows
``1..P`` the flattened ``patch_size × patch_size × channels`` patches in raster order;
``targets`` hold the label, ``weights`` are 1 at the class position and 0 elsewhere (so the
loss is the classification loss of the class token). Training batches are a pure function of
``(seed, step)``; evaluation walks the held-out images in order, the last batch padded with
weight-0 images, so every evaluation scores each held-out image exactly once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from colossal_jax.data.batch import sequence_batch

HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 20240601
"""Seeds the held-out permutation and the generated images (never ``--seed``)."""
GENERATED_PER_CLASS = 200
"""Images of each class in a generated set."""
GRID = 4
"""Side of a generated class pattern before upsampling."""


class ImageSource(Protocol):
    """``len(source)`` images of ``shape`` (H, W, C) in ``[0, 1]``-ish floats, by index."""

    name: str
    num_classes: int

    @property
    def shape(self) -> tuple[int, int, int]: ...

    def __len__(self) -> int: ...

    def examples(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(images [k, H, W, C] float32, labels [k] int32)`` of the images at ``index``."""
        ...


@dataclass(frozen=True)
class ArrayImages:
    name: str
    images: np.ndarray
    labels: np.ndarray
    num_classes: int

    @property
    def shape(self) -> tuple[int, int, int]:
        h, w, c = self.images.shape[1:]
        return (h, w, c)

    def __len__(self) -> int:
        return len(self.labels)

    def examples(self, index):
        return self.images[index], self.labels[index]


@dataclass(frozen=True)
class GeneratedImages:
    name: str
    size: int
    channels: int
    num_classes: int
    count: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)

    def __len__(self) -> int:
        return self.count

    def _pattern(self, label: int) -> np.ndarray:
        rng = np.random.default_rng([SPLIT_SEED, 1, label])
        coarse = rng.uniform(-1.0, 1.0, size=(GRID, GRID, self.channels))
        rep = -(-self.size // GRID)
        return np.kron(coarse, np.ones((rep, rep, 1)))[: self.size, : self.size]

    def examples(self, index):
        images = np.empty((len(index), *self.shape), np.float32)
        labels = (np.asarray(index) % self.num_classes).astype(np.int32)
        reach = max(1, self.size // 8)
        for row, (i, label) in enumerate(zip(index, labels, strict=True)):
            rng = np.random.default_rng([SPLIT_SEED, 2, int(i)])
            dy, dx = rng.integers(-reach, reach + 1, size=2)
            img = np.roll(self._pattern(int(label)), (int(dy), int(dx)), axis=(0, 1))
            img = rng.uniform(0.5, 1.0) * img + rng.normal(0.0, 0.3, size=img.shape)
            images[row] = 0.5 + 0.5 * img
        return images, labels


def digits() -> ArrayImages | None:
    """scikit-learn's 8×8 digits, pixels in ``[0, 1]``; None without scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    d = load_digits()
    images = (d.images / 16.0).astype(np.float32)[..., None]
    return ArrayImages("digits (scikit-learn)", images, d.target.astype(np.int32), 10)


def generated(size: int, channels: int, num_classes: int) -> GeneratedImages:
    return GeneratedImages(
        f"shapes {size}×{size}×{channels}, {num_classes} classes (generated)",
        size,
        channels,
        num_classes,
        GENERATED_PER_CLASS * num_classes,
    )


STAND_IN = "trained on generated images, not the digits (scikit-learn is not installed)"
"""The summary line's caveat when generated images stood in for ``--data digits``."""


def spec_stands_in(spec: str, note: str | None) -> bool:
    """Whether :func:`load_images` of ``spec`` gave generated images in place of the digits
    (its ``note``)."""
    return spec == "digits" and note is not None


def load_images(
    spec: str, size: int, channels: int, num_classes: int
) -> tuple[ImageSource, str | None]:
    """``(source, note)`` for ``--data digits|shapes`` and a model taking ``size × size ×
    channels`` images of ``num_classes`` classes (the rules checked that they fit); the note says
    when generated images stand in for the digits."""
    if spec == "digits":
        found = digits()
        if found is not None:
            return found, None
        return generated(8, 1, 10), (
            "scikit-learn is not installed: generated 8×8 images of 10 classes stand in for the "
            'digits (pip install scikit-learn, or pip install -e ".[vision]")'
        )
    return generated(size, channels, num_classes), None


def split(
    source: ImageSource, fraction: float = HELD_OUT_FRACTION
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)`` image indices: a fixed permutation, its last ``fraction`` held out."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(source))
    held = max(1, math.ceil(fraction * len(source)))
    return order[:-held], order[-held:]


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """``[k, H, W, C]`` -> ``[k, (H/p)·(W/p), p·p·C]``: patches in raster order, each flattened
    row by row (pixel-major, channels innermost)."""
    k, h, w, c = images.shape
    g, r = h // patch, w // patch
    x = images.reshape(k, g, patch, r, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(k, g * r, patch * patch * c)


@dataclass(frozen=True)
class ImageBatches:
    """Deterministic, resumable image batches as tokens (see the module docstring).

    Attributes:
      source, indices: the images and which of them this split holds.
      patch_size: side of a patch.
      ordered: walk ``indices`` in order, ``batch_size`` per step, the last batch padded with
        weight-0 images (evaluation); otherwise draw ``batch_size`` distinct images per step from
        a generator seeded by ``(seed, step)`` (training).
      layout_order: a permutation of the sequence (ring attention's zigzag), or None.
      caveat: what the run's summary line repeats about these images (:data:`STAND_IN`), or
        None.
    """

    source: ImageSource
    indices: np.ndarray
    batch_size: int
    seed: int
    patch_size: int
    ordered: bool = False
    layout_order: np.ndarray | None = None
    caveat: str | None = None

    @property
    def name(self) -> str:
        return self.source.name + (" (held out)" if self.ordered else "")

    @property
    def seq_len(self) -> int:
        h, w, _ = self.source.shape
        return (h // self.patch_size) * (w // self.patch_size) + 1

    def batch(self, step: int) -> dict[str, np.ndarray]:
        b, n = self.batch_size, len(self.indices)
        if self.ordered:
            at = step * b + np.arange(b)
            valid = at < n
            pick = np.where(valid, at, 0)
        else:
            rng = np.random.default_rng([self.seed, step])
            pick = rng.choice(n, size=b, replace=b > n)
            valid = np.ones(b, bool)
        images, labels = self.source.examples(self.indices[pick])
        patches = patchify(images, self.patch_size)
        s = patches.shape[1] + 1
        tokens = np.zeros((b, s, patches.shape[2]), np.float32)
        tokens[:, 1:] = patches
        weights = np.zeros((b, s), np.float32)
        weights[:, 0] = valid
        targets = np.broadcast_to(labels[:, None], (b, s)).astype(np.int32)
        return sequence_batch(tokens, targets, weights, self.layout_order)

    def evaluation_batches(self, requested: int) -> int:
        """Held-out batches an evaluation takes: enough to score every held-out image once
        (``eval_batches`` does not apply); ``requested`` for a training split."""
        return math.ceil(len(self.indices) / self.batch_size) if self.ordered else requested

    def epochs(self, steps: int) -> str | None:
        """A note of how many times the run reads the training images, when it does."""
        read, n = steps * self.batch_size, len(self.indices)
        if self.ordered or read <= n:
            return None
        return (
            f"the run reads {read:,} training images but the training split of "
            f"{self.source.name} holds {n:,}: about {read / n:.1f} epochs"
        )
