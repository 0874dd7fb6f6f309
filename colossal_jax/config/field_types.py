"""The types of the config dataclasses' fields, checked when one is constructed.

The command line converts every flag to its field's type; the Python API
(``TrainConfig(steps="10")``) hands values in as they are. :func:`check_field_types` runs in each
config's ``__post_init__`` and raises one :class:`ConfigError` line naming the field, its flag,
the type it needs and a valid value, before anything reads the value. A bool is not an int here
(``steps=True`` would train one step), a float with a fraction is not an int, an integer is a
valid float (``lr=1`` is converted to ``1.0``) and a numpy scalar counts as the Python number it
holds; a dict given for a nested config (``parallel={"data": 8}``) is built into it, its keys
checked like keyword arguments. JAX-free.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from functools import cache
from typing import Any

from colossal_jax.config.errors import ConfigError, suggest
from colossal_jax.config.flags import KEY


def check_field_types(obj: Any) -> None:
    """Check (and normalise, on the frozen ``obj``) every field of the dataclass ``obj``: an
    exact type, an integer given as a float field converted to float, a numpy scalar to its
    Python number, a dict for a nested config built into it. Raises :class:`ConfigError`."""
    cls = type(obj)
    for f, kinds in _fields(cls):
        value = getattr(obj, f.name)
        converted = _convert(cls, f, kinds, value)
        if converted is not value:
            object.__setattr__(obj, f.name, converted)


@cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, tuple[Any, ...]], ...]:
    """Each field of ``cls`` with the types it accepts (:func:`_kinds`), worked out once per
    class: the planner builds tens of thousands of configs a search."""
    hints = typing.get_type_hints(cls)
    return tuple((f, _kinds(hints[f.name])) for f in dataclasses.fields(cls))


def _convert(cls: type, f: dataclasses.Field, kinds: tuple[Any, ...], value: Any) -> Any:
    """``value`` as one of ``kinds`` (the field's accepted types), or a ConfigError naming
    the field."""
    if type(value) in kinds:  # already exactly an accepted type: nothing to convert
        return value
    for kind in kinds:
        if kind is bool and isinstance(value, bool | _np_bool()):
            return bool(value)
        if kind is int and _is_integer(value):
            return value if isinstance(value, int) else int(value)  # an int subclass kept
        if kind is float and _is_real(value):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
        if kind is dict and isinstance(value, dict):
            return value
        if dataclasses.is_dataclass(kind):
            if isinstance(value, kind):
                return value
            if isinstance(value, dict):
                return _build(cls, f, kind, value)
    raise ConfigError(_message(cls, f, kinds, value))


def _kinds(annotation: Any) -> tuple[Any, ...]:
    """The accepted types of ``annotation``: ``int | None`` → ``(int, NoneType)``; a generic
    (``dict[str, Any]``) as its origin."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(k for a in typing.get_args(annotation) for k in _kinds(a))
    return (typing.get_origin(annotation) or annotation,)


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | _np_bool())


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | _np_bool())


def _np_bool() -> type:
    """numpy's bool scalar type where numpy is loaded (it is not an ``int`` either), else
    ``bool``; the configuration floor never imports numpy itself."""
    import sys

    np = sys.modules.get("numpy")
    return np.bool_ if np is not None else bool


def _build(cls: type, f: dataclasses.Field, kind: type, value: dict) -> Any:
    """``kind(**value)``, an unknown key named with a near miss and the valid keys."""
    names = [g.name for g in dataclasses.fields(kind) if g.init]
    for key in value:
        if key not in names:
            raise ConfigError(
                f"{cls.__name__}({f.name}={value!r}): {kind.__name__} has no field {key!r}; "
                f"{suggest(key, names, suffix=' ')}fields: {', '.join(names)}"
            )
    return kind(**value)


def _message(cls: type, f: dataclasses.Field, kinds: tuple[Any, ...], value: Any) -> str:
    """``TrainConfig(steps='10'): steps (--steps) must be an int, not str; e.g. steps=200``."""
    names = [k.__name__ for k in kinds if k is not type(None)]
    need = " or ".join(names) + (" or None" if type(None) in kinds else "")
    option = f.metadata.get(KEY)
    flag = f" ({option.name or '--' + f.name.replace('_', '-')})" if option else ""
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    example = f"; e.g. {f.name}={default!r}" if default is not None else ""
    if dataclasses.is_dataclass(default):
        need += " (or a dict of its fields)"
        example = f"; e.g. {f.name}={type(default).__name__}()"
    article = "an" if need[0] in "aeiou" else "a"
    return (
        f"{cls.__name__}({f.name}={value!r}): {f.name}{flag} must be {article} {need}, not "
        f"{type(value).__name__}{example}"
    )
