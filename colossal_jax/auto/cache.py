"""A disk cache of the planner's results, keyed by everything that determines them.

One JSON file per result under ``$COLOSSAL_JAX_CACHE`` (default
``~/.cache/colossal_jax/planner``), in a folder per kind (``compiled``, ``measured``), named by
the SHA-256 of its key. The key of a plan's result (:func:`plan_key`) holds:

- the plan's resolved fields (the validated config with every nested field, the mesh shape,
  microbatches, accumulation, batch shards, tensor split, zigzag order, the resolved model
  config, its family and task);
- the JAX and jaxlib versions, the platform, device kind and device count of this process;
- a digest of the source of ``colossal_jax`` (any edit to the library invalidates every entry)
  but the planner's own modules, which decide which plans are tried and how they are costed,
  not what a plan compiles to (``auto/measure.py``, which reads the figures, counts), the
  package version, and the source folder of the plan's model family (the module its
  ``Family.module`` names, found without importing the zoo);
- the kind and any extra parts the caller adds (e.g. the number of timed steps).

Writers are safe to run concurrently: a result is written to a temporary file in the same
folder and renamed over its name (``os.replace``, atomic on POSIX), so a reader sees the whole
old file, the whole new one, or none. A file that cannot be read as JSON is a miss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from colossal_jax.config.families import family_of
from colossal_jax.config.plan import Plan

ENV = "COLOSSAL_JAX_CACHE"
"""The environment variable naming the cache folder."""

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def default_dir() -> Path:
    """``$COLOSSAL_JAX_CACHE``, else ``~/.cache/colossal_jax/planner``."""
    env = os.environ.get(ENV)
    return Path(env) if env else Path.home() / ".cache" / "colossal_jax" / "planner"


class Cache:
    """JSON results of one ``kind`` under ``directory`` (default :func:`default_dir`)."""

    def __init__(self, kind: str, directory: Path | str | None = None):
        self.directory = Path(directory) if directory is not None else default_dir()
        self.kind = kind
        self.folder = self.directory / kind

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The result stored under ``key``, or None (absent, or not readable as JSON)."""
        try:
            with open(self.path(key)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return record.get("value") if isinstance(record, dict) else None

    def put(self, key: str, value: dict[str, Any], about: dict[str, Any] | None = None) -> None:
        """Store ``value`` under ``key`` atomically (``about``: what the key was made of, kept
        beside it for a reader)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"value": value, "about": about or {}}, f, sort_keys=True)
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def plan_key(plan: Plan, kind: str, *extra: Any) -> tuple[str, dict[str, Any]]:
    """``(key, parts)``: the hex SHA-256 of what determines ``kind``'s result for ``plan`` on
    this process's devices (see the module docstring) and the parts it hashes."""
    parts = {
        "kind": kind,
        "plan": plan_fields(plan),
        "environment": environment(),
        "source": source_digest(),
        "family_source": family_digest(plan.config.model),
        "extra": [repr(e) for e in extra],
    }
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest(), parts


def plan_fields(plan: Plan) -> dict[str, Any]:
    """The resolved fields of ``plan`` as plain data (what decides what it compiles to)."""
    return {
        "config": _plain(plan.config),
        "model": _plain(plan.model),
        "family": plan.family,
        "task": plan.task,
        "data_vocab": plan.data_vocab,
        "mesh_shape": list(plan.mesh_shape),
        "microbatches": plan.microbatches,
        "grad_accum": plan.grad_accum,
        "batch_shards": plan.batch_shards,
        "tensor_split": _plain(plan.tensor_split),
        "zigzag": plan.zigzag,
    }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


@cache
def environment() -> dict[str, Any]:
    """The JAX and jaxlib versions, platform, device kind and count of this process."""
    import jax

    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


PLANNER_SOURCES = ("auto",)
"""Folders of ``colossal_jax`` left out of :func:`source_digest` (but :data:`FIGURES`)."""
FIGURES = ("auto/measure.py",)


@cache
def source_digest() -> str:
    """SHA-256 of the package version and every ``.py`` file of ``colossal_jax`` but the
    planner's own (:data:`PLANNER_SOURCES`, except :data:`FIGURES`)."""

    def counts(rel: Path) -> bool:
        return rel.parts[0] not in PLANNER_SOURCES or rel.as_posix() in FIGURES

    return _tree_digest(PACKAGE_ROOT, _version("colossal-jax"), counts)


@cache
def family_digest(model: str) -> str:
    """SHA-256 of the ``.py`` files beside the module that builds ``model``'s family (located
    by ``importlib.util.find_spec``, which runs none of it); ``"unknown"`` when not found."""
    return module_digest(family_of(model).module.partition(":")[0])


@cache
def module_digest(module: str) -> str:
    """SHA-256 of the ``.py`` files beside ``module`` (found without importing it);
    ``"unknown"`` when not found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return "unknown"
    return _tree_digest(Path(spec.origin).resolve().parent, module)


def _tree_digest(root: Path, salt: str, counts: Callable[[Path], bool] = lambda _: True) -> str:
    h = hashlib.sha256(salt.encode())
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if counts(rel):
            h.update(rel.as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"
