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
- ``flatten``: HF's tensor, its axes permuted, flattened to ``[-1, last]`` (ViT's patch
  convolution ``[out, c, p, p]`` becomes our ``[p·p·c, out]`` dense kernel; a ``[1, 1, h]``
  class token our ``[1, h]`` row).
- ``pad``: our axis is longer than HF's (a table or head padded to a multiple of 16): import
  fills the extra rows with zeros, export keeps HF's part.

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
      flatten: axes permutation of the HF tensor before it is flattened to ``[-1, last]``.
      pad: ``(axis, length)``: our (oriented) ``axis`` has ``length``, HF's fewer (zeros beyond).
      hf_shape: the HF tensor's shape; needed (for export) with ``flatten`` or ``pad``.
    """

    name: str
    transpose: bool = False
    cols: tuple[int, int] | None = None
    flatten: tuple[int, ...] | None = None
    pad: tuple[int, int] | None = None
    hf_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        if (self.flatten is not None or self.pad is not None) and (
            self.hf_shape is None or self.cols is not None or self.stacked
        ):
            raise ValueError(f"{self.name}: flatten/pad need hf_shape, no cols, no {{i}}")

    @property
    def stacked(self) -> bool:
        return "{i}" in self.name

    def hf_name(self, layer: int | None = None) -> str:
        return self.name.format(i=layer) if self.stacked else self.name

    def oriented(self, hf: np.ndarray) -> np.ndarray:
        """The HF tensor in our orientation, cut to our columns (a view: nothing is read, unless
        ``flatten`` or ``pad`` copy it)."""
        import numpy as np

        x = hf
        if self.flatten is not None:
            x = np.transpose(x, self.flatten)
            x = x.reshape(-1, x.shape[-1])
        x = x.T if self.transpose else x
        x = x[..., self.cols[0] : self.cols[1]] if self.cols is not None else x
        if self.pad is not None:
            axis, length = self.pad
            widths = [(0, 0)] * x.ndim
            widths[axis] = (0, length - x.shape[axis])
            x = np.pad(x, widths)
        return x

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        """The HF tensor of our (one layer's) parameter: the exact inverse of :meth:`oriented`
        for a piece without ``cols``."""
        import numpy as np

        assert self.cols is None
        x = ours
        if self.pad is not None:
            assert self.hf_shape is not None
            shape = tuple(self.hf_shape[a] for a in self.flatten or range(len(self.hf_shape)))
            if self.flatten is not None:
                shape = (int(np.prod(shape[:-1], dtype=np.int64)), shape[-1])
            shape = tuple(reversed(shape)) if self.transpose else shape
            x = x[tuple(slice(0, n) for n in shape)]
        x = x.T if self.transpose else x
        if self.flatten is not None:
            assert self.hf_shape is not None
            x = x.reshape([self.hf_shape[a] for a in self.flatten])
            x = np.transpose(x, np.argsort(self.flatten))
        return x


ParamMap = dict[str, Piece]
"""Our parameter's dotted path -> its :class:`Piece`."""


def layer_pieces(
    layer: str, norms: tuple[tuple[str, str], ...], linears: tuple[tuple[str, str], ...]
) -> ParamMap:
    """The pieces of an encoder layer stack (BERT, ViT) whose HF modules are ``nn.LayerNorm``
    (``weight``/``bias`` -> our ``scale``/``bias``) and ``nn.Linear`` (``weight``ᵀ/``bias`` ->
    our ``kernel``/``bias``): ``(ours, theirs)`` module names, ``layer`` the HF prefix of layer
    ``{i}``."""
    pmap: ParamMap = {}
    for ours, theirs in norms:
        pmap[f"blocks.layers.{ours}.scale"] = Piece(f"{layer}{theirs}.weight")
        pmap[f"blocks.layers.{ours}.bias"] = Piece(f"{layer}{theirs}.bias")
    for ours, theirs in linears:
        pmap[f"blocks.layers.{ours}.kernel"] = Piece(f"{layer}{theirs}.weight", transpose=True)
        pmap[f"blocks.layers.{ours}.bias"] = Piece(f"{layer}{theirs}.bias")
    return pmap


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
    out: dict[str, tuple[tuple[int, ...], Sources]] = {}
    for path, piece in pmap.items():
        shape = shapes[path]
        if piece.hf_shape is not None:  # flatten/pad: one parameter, one HF tensor
            out[piece.name] = (tuple(piece.hf_shape), [(path, None)])
            continue
        one = shape[1:] if piece.stacked else shape
        cols = piece.cols or (0, one[-1])
        if cols[1] - cols[0] != one[-1]:
            raise ValueError(f"{path}: columns {cols} of the HF tensor but {one[-1]} wide")
        for layer in range(shape[0]) if piece.stacked else [None]:
            entry = (cols, tuple(one[:-1]), piece.transpose, path, layer)
            found.setdefault(piece.hf_name(layer), []).append(entry)
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

    first = pmap[sources[0][0]]
    if first.cols is None:
        (path, layer), *more = sources
        assert not more, f"{first.name} has more than one source but no columns"
        value = param(path) if layer is None else param(path)[layer]
        out = first.to_hf(value)
        assert out.shape == tuple(shape), (first.name, out.shape, shape)
        return out
    transpose = first.transpose
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
