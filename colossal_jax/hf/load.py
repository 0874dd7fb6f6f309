"""``--init-from-hf DIR``: a Hugging Face directory's weights placed straight into a run's
parameter shardings.

Each of our parameters is built by ``jax.make_array_from_callback`` in its sharding
(``Run.param_shardings``: any mesh, tensor mode, pipeline or ZeRO-3 split): the callback is
asked, per local device, for that device's index and reads just that region from the HF tensors
(memory-mapped safetensors, :mod:`colossal_jax.hf.tensors`), applying the family's map
(:mod:`colossal_jax.hf.mapping`). No parameter is assembled whole on a device unless its
sharding replicates it; the host holds one shard at a time (replicas of a shard are read once).
Weights stored in fp16/bf16 are cast to the parameters' fp32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from colossal_jax.config import ConfigError
from colossal_jax.hf.checks import check_hf_directory
from colossal_jax.hf.mapping import ParamMap, read_region, source_shape
from colossal_jax.hf.tensors import read_tensors


def dotted(path: tuple) -> str:
    """``blocks.layers.attn.query.kernel`` of a key path to a parameter in an nnx State, its
    shardings or its serialised dict: the Variable's own ``value`` (attribute or last key) is not
    part of the name (no parameter is called ``value``; modules may be)."""
    parts = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    return ".".join(parts)


def resolve_names(
    pmap: ParamMap, tensors: dict[str, np.ndarray], prefix: str, n_layer: int
) -> ParamMap:
    """The map with each HF name as the file spells it: files saved from the base model (e.g.
    ``GPT2Model``) lack the head model's ``prefix``."""

    def present(name: str) -> str | None:
        for candidate in (name, name.removeprefix(prefix)):
            if candidate in tensors:
                return candidate
        return None

    out: ParamMap = {}
    for path, piece in pmap.items():
        probe = piece.hf_name(0)
        found = present(probe)
        if found is None:
            raise ConfigError(f"the Hugging Face weights have no tensor {probe} (for our {path})")
        if found != probe:
            piece = dataclasses.replace(piece, name=piece.name.removeprefix(prefix))
        for i in range(n_layer) if piece.stacked else []:
            if piece.hf_name(i) not in tensors:
                raise ConfigError(
                    f"the Hugging Face weights have no tensor {piece.hf_name(i)} (for layer {i} "
                    f"of our {path}; config.json says n_layer={n_layer})"
                )
        out[path] = piece
    return out


def check_all_used(pmap: ParamMap, tensors: dict[str, np.ndarray], ignored: tuple, n_layer: int):
    """Every HF tensor is read by some parameter (or is a known buffer): nothing is dropped."""
    used = {p.hf_name(i) for p in pmap.values() for i in (range(n_layer) if p.stacked else [0])}
    left = sorted(n for n in tensors if n not in used and not n.endswith(ignored))
    if left:
        more = f" and {len(left) - 1} more" if len(left) > 1 else ""
        raise ConfigError(
            f"the Hugging Face weights hold {left[0]}{more}, which our model has no parameter "
            "for (an architecture option config.json does not show?)"
        )


def load_params(run: Any, directory: str | None = None) -> nnx.State:
    """The parameters of ``run`` (a :class:`colossal_jax.training.run.Run`) from the Hugging Face
    directory ``directory`` (default ``run.cfg.init_from_hf``), in ``run.param_shardings``."""
    directory = directory or run.cfg.init_from_hf
    family, config = check_hf_directory(directory, run.cfg.model)
    arch = dataclasses.asdict(run.model)
    tensors = read_tensors(directory)
    pmap = family.param_map(arch, tied=family.tied(config))
    pmap = resolve_names(pmap, tensors, family.PREFIX, run.model.n_layer)
    check_all_used(pmap, tensors, family.IGNORED, run.model.n_layer)

    def place(path, sharding, variable):
        name = dotted(path)
        if name not in pmap:
            raise ConfigError(f"the {family.MODEL_TYPE} map has no source for our parameter {name}")
        piece = pmap[name]
        abstract = variable.get_value()
        shape, dtype = tuple(abstract.shape), abstract.dtype
        got = source_shape(piece, tensors, run.model.n_layer)
        if got != shape:
            raise ConfigError(
                f"{directory}: {piece.hf_name(0)} gives our {name} the shape {got}, but the "
                f"model needs {shape}"
            )
        cache: dict[tuple, np.ndarray] = {}

        def region(index: tuple[slice, ...]) -> np.ndarray:
            key = tuple(s.indices(n) for s, n in zip(index, shape, strict=True))
            if key not in cache:
                cache[key] = read_region(piece, tensors, index, shape, dtype)
            return cache[key]

        array = jax.make_array_from_callback(shape, sharding, region)
        return variable.replace(value=array)

    return jax.tree_util.tree_map_with_path(
        place, run.param_shardings, run.abstract_params, is_leaf=_is_sharding
    )


def _is_sharding(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding)
