"""Reading and writing the tensor files of a Hugging Face directory, without torch where possible.

- ``*.safetensors`` (one file, or shards listed by ``model.safetensors.index.json``): read by a
  small reader of the format (an 8-byte little-endian header length, a JSON header of
  ``name -> {dtype, shape, data_offsets}``, then the raw little-endian bytes) as ``np.memmap``
  views. Nothing is read until a slice of a tensor is taken, so loading a model into a mesh reads
  from disk only the parts each process's devices hold. ``BF16`` becomes ``ml_dtypes.bfloat16``
  (shipped with JAX).
- ``pytorch_model.bin`` (or shards listed by ``pytorch_model.bin.index.json``): needs torch
  (the build for the machine, docs/huggingface.md; the ``hf`` extra leaves it out); loaded
  memory-mapped with ``torch.load(weights_only=True)``.
- Writing (:func:`write_safetensors`): one ``model.safetensors``, the tensors streamed one at a
  time, with the ``{"format": "pt"}`` metadata ``transformers`` expects.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from colossal_jax.config import ConfigError
from colossal_jax.hf import SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX, WEIGHT_FILES

_DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


def _np_dtype(code: str, where: Path) -> np.dtype:
    if code == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code not in _DTYPES:
        raise ConfigError(f"{where}: tensor dtype {code} is not supported (use F32, F16 or BF16)")
    return np.dtype(_DTYPES[code])


def _code(dtype: np.dtype) -> str:
    if dtype.name == "bfloat16":
        return "BF16"
    for code, name in _DTYPES.items():
        if np.dtype(name) == dtype:
            return code
    raise ValueError(f"dtype {dtype} cannot be written to safetensors")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """``name -> array`` of one safetensors file: read-only memory maps (lazy)."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise ConfigError(f"{path} is not a readable safetensors file ({e})") from None
    header.pop("__metadata__", None)
    start = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        dtype = _np_dtype(info["dtype"], path)
        shape = tuple(int(d) for d in info["shape"])
        begin, end = info["data_offsets"]
        if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise ConfigError(f"{path}: tensor {name} has {end - begin} bytes for shape {shape}")
        out[name] = data[start + begin : start + end].view(dtype).reshape(shape)
    return out


def _read_torch(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            f"{path} is a PyTorch pickle, which needs torch to read: install torch (the build for "
            "this machine: docs/huggingface.md), or save the model with safetensors "
            "(save_pretrained's default)"
        ) from None
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    out = {}
    for name, t in state.items():
        t = t.detach()
        out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return out


def read_tensors(directory: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a Hugging Face model directory, by name (lazy for safetensors)."""
    root = Path(directory)
    for index, reader in ((SAFETENSORS_INDEX, read_safetensors), (TORCH_BIN_INDEX, _read_torch)):
        if (root / index).is_file():
            weight_map = json.loads((root / index).read_text())["weight_map"]
            out: dict[str, np.ndarray] = {}
            for shard in sorted(set(weight_map.values())):
                out.update(reader(root / shard))
            return out
    if (root / SAFETENSORS).is_file():
        return read_safetensors(root / SAFETENSORS)
    if (root / TORCH_BIN).is_file():
        return _read_torch(root / TORCH_BIN)
    raise ConfigError(f"{root} holds none of {', '.join(WEIGHT_FILES)}")


def write_safetensors(
    path: Path,
    shapes: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    tensors: Callable[[str], np.ndarray],
) -> None:
    """Write ``model.safetensors`` holding ``name -> (shape, dtype)`` of ``shapes`` (in that
    order), asking ``tensors(name)`` for each array only when it is written: one at a time."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype) in shapes.items():
        size = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": _code(np.dtype(dtype)),
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, (shape, dtype) in shapes.items():
            array = np.ascontiguousarray(tensors(name), dtype=np.dtype(dtype).newbyteorder("<"))
            if array.shape != tuple(shape):
                raise ValueError(f"{name}: got shape {array.shape}, announced {tuple(shape)}")
            f.write(array.tobytes())
