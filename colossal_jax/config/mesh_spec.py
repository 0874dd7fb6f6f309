"""``--mesh``: axis=size pairs, the ``tensor=N`` shorthand, and the TOML presets of ``meshes/``.

The presets ship as package data of ``colossal_jax_meshes`` (the repository's ``meshes/``) and are
read with :mod:`importlib.resources`, so they are found wherever the package is installed.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from colossal_jax.config.choices import AXES
from colossal_jax.config.errors import ConfigError, suggest
from colossal_jax.config.parallel_rules import factor_tensor
from colossal_jax.config.tensor_modes import takes_depth

MESH_PACKAGE = "colossal_jax_meshes"
"""The package whose ``*.toml`` files are the mesh presets (the repository's ``meshes/``)."""


def _meshes_dir():
    """The presets' folder (a :class:`importlib.resources.abc.Traversable`)."""
    try:
        return resources.files(MESH_PACKAGE)
    except ModuleNotFoundError:
        raise ConfigError(
            f"the mesh presets package {MESH_PACKAGE} is not installed; run pip install -e . "
            "(or give --mesh as axis=size pairs, e.g. data=8)"
        ) from None


def parse_mesh(
    spec: str | None,
    n_devices: int | None,
    *,
    tensor_mode: str = "none",
    tensor_depth: int | None = None,
) -> dict[str, int]:
    """Parse ``--mesh``: ``data=2,tensor_row=2``, a preset name from ``meshes/``, or a TOML path.

    Hyphenated spellings (``tensor-row``) are accepted; ``tensor=N`` is a shorthand factored by
    the tensor mode. Unnamed axes are 1, except ``data``, which takes the remaining devices.
    Returns the axis sizes, plus ``tensor_mode``/``seq_mode``/``zero`` if a preset sets them.
    With ``n_devices=None`` (not known yet) an unnamed ``data`` is left out of the result.
    """
    if tensor_depth is not None and tensor_depth < 1:
        raise ConfigError(
            f"--tensor-depth {tensor_depth} must be at least 1 (e.g. --tensor-depth 2)"
        )
    if spec is not None and spec.strip() == "":
        raise ConfigError(
            f"--mesh {spec!r} is empty; omit --mesh or give e.g. data={n_devices} (without "
            f"--mesh, data parallelism over all {n_devices} devices)"
        )
    preset = _preset_path(spec) if spec is not None else None
    if preset is not None:
        if tensor_depth is not None:
            raise ConfigError(
                f"--tensor-depth {tensor_depth} does not apply to the preset {spec} (it sets its "
                "own axes); omit --tensor-depth"
            )
        return _load_preset(preset, n_devices)
    if tensor_depth is not None and (not takes_depth(tensor_mode) or spec is None):
        raise ConfigError(_depth_alone(tensor_depth, spec, tensor_mode))
    if spec is None:
        return {"data": n_devices} if n_devices is not None else {}
    sizes, tensor_total = _axis_sizes(spec)
    if tensor_depth is not None and tensor_total is None:
        raise ConfigError(_depth_alone(tensor_depth, spec, tensor_mode))
    if tensor_total is not None:
        given = [a for a in ("tensor_row", "tensor_col", "tensor_depth") if a in sizes]
        if given:
            raise ConfigError(f"--mesh gives both tensor= and {given[0]}=; use one or the other")
        sizes.update(factor_tensor(tensor_total, tensor_mode, tensor_depth))
    if "data" not in sizes and n_devices is not None:
        sizes["data"] = _data_size(spec, sizes, n_devices)
    return sizes


def _axis_sizes(spec: str) -> tuple[dict[str, int], int | None]:
    """``(sizes of the named axes, the tensor=N shorthand or None)`` of ``axis=size`` pairs."""
    sizes: dict[str, int] = {}
    tensor_total: int | None = None
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, n = _axis_size(part)
        if name == "tensor":
            if tensor_total is not None:
                raise ConfigError(
                    f"--mesh names tensor twice (tensor={tensor_total} and tensor={n}); give it "
                    f"once, e.g. tensor={tensor_total}"
                )
            tensor_total = n
            continue
        if name in sizes:
            raise ConfigError(
                f"--mesh names axis {name!r} twice ({name}={sizes[name]} and {name}={n}); give "
                f"each axis once, e.g. {name}={sizes[name]}"
            )
        sizes[name] = n
    return sizes, tensor_total


def _axis_size(part: str) -> tuple[str, int]:
    """One ``axis=size`` entry: a known axis (or ``tensor``, hyphens read as underscores) and a
    size of at least 1."""
    if "=" not in part:
        raise ConfigError(
            f"--mesh entry {part!r} is not axis=size (e.g. data=2,tensor_row=4), nor a preset "
            f"in {MESH_PACKAGE} ({', '.join(list_presets()) or 'none'})"
        )
    name, value = (s.strip() for s in part.split("=", 1))
    name = name.replace("-", "_")
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--mesh {name}={value!r}: the size must be an integer") from None
    if n < 1:
        raise ConfigError(f"--mesh {name}={n}: sizes must be at least 1")
    if name != "tensor" and name not in AXES:
        close = difflib.get_close_matches(name, AXES + ("tensor",), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"--mesh axis {name!r} is unknown; {hint}valid axes: {', '.join(AXES)} (or tensor)"
        )
    return name, n


def _data_size(spec: str, sizes: dict[str, int], n_devices: int) -> int:
    """The ``data`` axis an unnamed data axis takes: the devices the named axes leave."""
    rest = math.prod(sizes.values())
    if n_devices % rest:
        raise ConfigError(
            f"--mesh {spec} uses {rest} devices per data replica, which does not divide the "
            f"{n_devices} devices; choose sizes whose product divides {n_devices}"
        )
    return n_devices // rest


def _depth_alone(depth: int, spec: str | None, mode: str) -> str:
    return (
        f"--tensor-depth {depth} applies only to --mesh tensor=N with --tensor-mode 2.5d (got "
        f"--mesh {spec or '(none)'}, --tensor-mode {mode}); e.g. --mesh tensor=8 --tensor-mode "
        "2.5d --tensor-depth 2, or omit --tensor-depth"
    )


def list_presets() -> list[str]:
    names = (p.name for p in _meshes_dir().iterdir())
    return sorted(n.removesuffix(".toml") for n in names if n.endswith(".toml"))


def _preset_path(spec: str) -> Path | None:
    if spec.endswith(".toml"):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"--mesh {spec}: no such TOML file")
        return path
    if "=" not in spec and "," not in spec:
        path = _meshes_dir() / f"{spec}.toml"
        if path.is_file():
            return path
        raise ConfigError(
            f"--mesh {spec!r} is neither axis=size pairs nor a preset; presets: "
            f"{', '.join(list_presets())}"
        )
    return None


PRESET_KEYS = {
    "mesh": {**dict.fromkeys(AXES, int), "tensor": int},
    "modes": {
        "tensor_mode": str,
        "seq_mode": str,
        "zero": int,
        "tensor_depth": int,
        "pipeline": str,
        "microbatches": int,
        "virtual_stages": int,
    },
    "train": {"remat": str, "offload": str, "grad_accum": int, "precision": str},
}
"""The sections of a mesh preset and the type of each key: ``[mesh]`` the axis sizes (or the
``tensor`` shorthand), ``[modes]`` the modes; nothing else is read, so nothing else is allowed."""


def read_preset(path: Path) -> dict[str, dict[str, Any]]:
    """The sections of the preset ``path``, parsed strictly: valid TOML, only the sections and
    keys of :data:`PRESET_KEYS` (a near miss named: ``[modes] zer0`` → did you mean 'zero'?),
    each value of its key's type (a bool is not an int) and at least one axis or mode. Raises
    :class:`ConfigError` naming the file, the section and the key."""
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--mesh {path}: not valid TOML ({e})") from None
    for section, table in doc.items():
        if section not in PRESET_KEYS:
            raise ConfigError(f"--mesh {path}: {_misplaced(section, table)}")
        keys = PRESET_KEYS[section]
        if not isinstance(table, dict):
            raise ConfigError(f"--mesh {path}: {section} must be a section [{section}]")
        for key, value in table.items():
            if key not in keys:
                raise ConfigError(
                    f"--mesh {path}: [{section}] has no key {key!r}; "
                    f"{suggest(key, keys, suffix=' ')}(its keys: {', '.join(keys)})"
                )
            kind = keys[key]
            if not isinstance(value, kind) or isinstance(value, bool):
                example = 1 if kind is int else '"2d"' if key == "tensor_mode" else '"ring"'
                raise ConfigError(
                    f"--mesh {path}: [{section}] {key} = {_toml(value)} must be "
                    f"{'an integer' if kind is int else 'a string'} (e.g. {key} = {example})"
                )
    if not any(doc.get(section) for section in PRESET_KEYS):
        raise ConfigError(
            f"--mesh {path} sets no axis and no mode; give [mesh] axis sizes (e.g. data = 8) "
            "and/or [modes], or omit --mesh for data parallelism over every device"
        )
    return doc


def _misplaced(name: str, value: Any) -> str:
    """What is wrong with a top-level entry ``name`` of a preset that is not a known section:
    an unknown section, or a key written outside a section."""
    sections = "[mesh] (axis sizes) and [modes] (tensor_mode, seq_mode, zero, tensor_depth)"
    if isinstance(value, dict):
        near = suggest(name, PRESET_KEYS, suffix=" ")
        return f"unknown section [{name}]; {near}a preset has {sections}"
    home = [s for s, keys in PRESET_KEYS.items() if name in keys]
    where = f"under [{home[0]}]" if home else f"in {sections}"
    return f"{name} = {_toml(value)} is outside a section; put it {where}"


def _toml(value: Any) -> str:
    """``value`` as TOML writes it: ``"1"``, ``true``, ``8``."""
    if isinstance(value, str):
        return f'"{value}"'
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _load_preset(path: Path, n_devices: int | None) -> dict[str, Any]:
    doc = read_preset(path)
    mesh = doc.get("mesh", {})
    spec = ",".join(f"{k}={v}" for k, v in mesh.items())
    modes = doc.get("modes", {})
    out: dict[str, Any] = parse_mesh(
        spec or None,
        n_devices,
        tensor_mode=modes.get("tensor_mode", "none"),
        tensor_depth=modes.get("tensor_depth"),
    )
    for key in PRESET_MODES:
        if key in modes:
            out[key] = modes[key]
    return out


PRESET_MODES = ("tensor_mode", "seq_mode", "zero", "pipeline", "microbatches", "virtual_stages")
"""The :class:`ParallelConfig` fields a preset's ``[modes]`` table may set."""
PRESET_TRAIN = tuple(PRESET_KEYS["train"])
"""The :class:`TrainConfig` fields a preset's ``[train]`` table may set (the planner's
presets, ``scripts/plan.py --out``, carry the memory knobs they were planned with)."""


def preset_train(spec: str | None) -> dict[str, Any]:
    """The ``[train]`` table of the preset ``spec`` names (``{}`` for axis=size pairs or a
    preset without one), restricted to :data:`PRESET_TRAIN`."""
    path = _preset_path(spec) if spec is not None and spec.strip() else None
    if path is None:
        return {}
    return dict(read_preset(path).get("train", {}))


def describe_preset(name: str) -> str:
    """One line for ``--list-meshes``: name, axis sizes, modes, and the preset's own comment."""
    path = _meshes_dir() / f"{name}.toml"
    text = path.read_text()
    doc = tomllib.loads(text)
    mesh = doc.get("mesh", {})
    axes = " ".join(["data=rest"] * ("data" not in mesh) + [f"{k}={v}" for k, v in mesh.items()])
    modes = " ".join(f"{k}={v}" for k, v in doc.get("modes", {}).items()) or "-"
    note = " ".join(
        line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")
    ).strip()
    return f"{name:14s} {axes:50s} {modes:24s} {note}".rstrip()
