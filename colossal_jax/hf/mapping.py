"""What a family's parameter map is made of, and how it is read and inverted.

A family module (:mod:`colossal_jax.hf.gpt2`, …) describes each of our parameters (a dotted
path of the model's ``nnx.State``, e.g. ``blocks.layers.attn.query.kernel``) as a
:class:`Piece` of one Hugging Face tensor. Three operations cover the families we map:

- ``{i}`` in the name: our parameter is a layer stack (``layers.Stack``: leading layer
  dimension); layer ``i`` is read from the tensor of HF's module ``i``.
- ``transpose``: HF holds the transpose of ours (``nn.Linear`` weights are ``[out, in]``, ours
  ``[in, out]``; a head tied to the ``[vocab, hidden]`` token embedding).
- ``cols``: ours is a column range (last axis, in our orientation) of a fused HF tensor (GPT-2's
  ``c_attn`` holds query, key and value side by side).

Import reads any rectangular region of one of our parameters straight from the HF tensors
(:func:`read_region`), so each device's shard is read by itself; export assembles each HF
tensor from the parameters that map to it (:func:`assemble`), the exact inverse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy is imported where arrays are read: the rules import this module
    import numpy as np


@dataclass(frozen=True)
class Piece:
    """Where one of our parameters comes from.

    Attributes:
      name: the HF tensor; ``{i}`` stands for the layer index of a stacked parameter.
      transpose: HF holds the transpose of our (per-layer) parameter.
      cols: ``(start, stop)``: our parameter is these columns of the (transposed) HF tensor.
    """

    name: str
    transpose: bool = False
    cols: tuple[int, int] | None = None

    @property
    def stacked(self) -> bool:
        return "{i}" in self.name

    def hf_name(self, layer: int | None = None) -> str:
        return self.name.format(i=layer) if self.stacked else self.name

    def oriented(self, hf: np.ndarray) -> np.ndarray:
        """The HF tensor in our orientation, cut to our columns (a view: nothing is read)."""
        x = hf.T if self.transpose else hf
        return x[..., self.cols[0] : self.cols[1]] if self.cols is not None else x


ParamMap = dict[str, Piece]
"""Our parameter's dotted path -> its :class:`Piece`."""


def source_shape(piece: Piece, tensors: Mapping[str, np.ndarray], n_layer: int) -> tuple:
    """The shape our parameter gets from ``tensors`` (leading ``n_layer`` when stacked)."""
    one = piece.oriented(tensors[piece.hf_name(0)]).shape
    return (n_layer, *one) if piece.stacked else tuple(one)


def read_region(
    piece: Piece,
    tensors: Mapping[str, np.ndarray],
    index: tuple[slice, ...],
    shape: tuple[int, ...],
    dtype,
) -> np.ndarray:
    """``ours[index]`` (ours has ``shape``) read from the HF ``tensors``, touching only that
    region, as ``dtype``."""
    import numpy as np

    if not piece.stacked:
        return np.asarray(piece.oriented(tensors[piece.name])[index], dtype=dtype)
    layers = range(*index[0].indices(shape[0]))
    return np.stack(
        [
            np.asarray(piece.oriented(tensors[piece.hf_name(i)])[index[1:]], dtype=dtype)
            for i in layers
        ]
    )


Sources = list[tuple[str, int | None]]
"""``(our path, layer or None)`` of each parameter (layer) that fills part of one HF tensor."""


def hf_shapes(
    pmap: ParamMap, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[tuple[int, ...], Sources]]:
    """For export: every HF tensor the map names, as ``name -> (HF shape, sources)``, from our
    parameters' ``shapes``. The column pieces of one tensor must tile all of its columns."""
    found: dict[str, list[tuple[tuple[int, int], tuple[int, ...], bool, str, int | None]]] = {}
    for path, piece in pmap.items():
        shape = shapes[path]
        one = shape[1:] if piece.stacked else shape
        cols = piece.cols or (0, one[-1])
        if cols[1] - cols[0] != one[-1]:
            raise ValueError(f"{path}: columns {cols} of the HF tensor but {one[-1]} wide")
        for layer in range(shape[0]) if piece.stacked else [None]:
            entry = (cols, tuple(one[:-1]), piece.transpose, path, layer)
            found.setdefault(piece.hf_name(layer), []).append(entry)
    out: dict[str, tuple[tuple[int, ...], Sources]] = {}
    for name, entries in found.items():
        entries.sort()
        edge = 0
        for (start, stop), lead, transpose, path, _ in entries:
            if start != edge or (lead, transpose) != entries[0][1:3]:
                raise ValueError(f"{name}: {path} does not fit next to the other pieces")
            edge = stop
        ours = (*entries[0][1], edge)
        hf = tuple(reversed(ours)) if entries[0][2] else ours
        out[name] = (hf, [(path, layer) for *_, path, layer in entries])
    return out


def assemble(
    shape: tuple[int, ...],
    sources: Sources,
    pmap: ParamMap,
    param: Callable[[str], np.ndarray],
) -> np.ndarray:
    """The HF tensor of ``shape`` filled from its ``sources`` (``param(path)`` gives one of our
    parameters as a host array): the exact inverse of :func:`read_region`."""
    import numpy as np

    transpose = pmap[sources[0][0]].transpose
    ours = tuple(reversed(shape)) if transpose else shape
    out: np.ndarray | None = None
    for path, layer in sources:
        value = param(path) if layer is None else param(path)[layer]
        if out is None:
            out = np.empty(ours, value.dtype)
        lo, hi = pmap[path].cols or (0, ours[-1])
        out[..., lo:hi] = value
    assert out is not None
    return out.T if transpose else out
