"""How a config field appears on the command line, declared on the field itself.

A field that is a flag is written ``steps: int = flag(200, "total steps of the run")``: the
dataclass default, and a :class:`Flag` in the field's metadata with what the field cannot say
itself (its help line, a spelling other than ``--field-name``, a valid value for error messages,
the tuple of :mod:`~colossal_jax.config.choices` its help lists). :func:`flags_of` reads them
back with the field's name, type and default; the command lines (:mod:`colossal_jax.cli`,
:mod:`colossal_jax.generate`) build their parsers from it and :func:`values_of` turns the parsed
flags back into field values. A field without a :class:`Flag` is set with ``--set`` only.
JAX-free, like the rest of the configuration floor.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

KEY = "flag"
"""The key of a field's :class:`Flag` in its ``dataclasses.field`` metadata."""

FAMILY_NOTE = "or the model family's (--list-models)"
"""Where the default of a ``default_from="family"`` flag comes from, as its help says it."""


@dataclass(frozen=True)
class Flag:
    """The command-line side of one config field.

    Attributes:
      help: the help line; ``{choices}`` in it becomes the valid values, comma-separated.
      name: the flag's spelling where it is not ``--`` and the field's name with hyphens
        (``OptimConfig.name`` is ``--optimizer``).
      example: a valid value that error messages offer (``--metrics-file: expected one
        argument; e.g. --metrics-file /tmp/metrics.jsonl``) where the default shows none.
      choices: returns the valid values, read each time a parser is built (a tuple of
        :mod:`colossal_jax.config.choices` named at call time, never copied).
      default_from: where the value comes from when the flag is not given, instead of the
        field's default (the flag then defaults to None, "not given"): ``family``, the model
        family's training defaults and then the field's; ``mesh``, the ``--mesh`` preset's
        modes and then the field's.
      metavar: the value's name in the help (``DIR``).
    """

    help: str
    name: str | None = None
    example: str | None = None
    choices: Callable[[], tuple[str, ...]] | None = None
    default_from: Literal["family", "mesh"] | None = None
    metavar: str | None = None


def flag(default: Any, help: str, **options: Any) -> Any:
    """A dataclass field with ``default`` that is also a command-line flag (:class:`Flag`'s
    ``options``: ``name``, ``example``, ``choices``, ``default_from``, ``metavar``)."""
    return dataclasses.field(default=default, metadata={KEY: Flag(help, **options)})


@dataclass(frozen=True)
class ConfigFlag:
    """A flagged field of a config class: its name, type and default with its :class:`Flag`."""

    field: str
    kind: type
    """``int``, ``float``, ``str`` or ``bool``: the field's type without ``| None``."""
    default: Any
    flag: Flag

    @property
    def option(self) -> str:
        """The flag as typed: ``--seq-len``."""
        return self.flag.name or "--" + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        """The attribute of the parsed flags that holds it: ``seq_len``."""
        return self.option.removeprefix("--").replace("-", "_")

    @property
    def help(self) -> str:
        """The help line: the choices filled in; for a family default, where it comes from."""
        text = self.flag.help
        if self.flag.choices is not None:
            text = text.replace("{choices}", ", ".join(self.flag.choices()))
        if self.flag.default_from == "family":
            text += f" (default {self.default}, {FAMILY_NOTE})"
        return text

    @property
    def example(self) -> Any:
        """A valid value for error messages: the declared one, or the default of a family flag
        (whose flag defaults to None); None where the flag's default serves."""
        if self.flag.example is not None:
            return self.flag.example
        return self.default if self.flag.default_from == "family" else None


def flags_of(cls: type, only: tuple[str, ...] | None = None) -> list[ConfigFlag]:
    """The flagged fields of the dataclass ``cls`` in declaration order (those named in
    ``only``, if given)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if KEY in f.metadata and (only is None or f.name in only):
            out.append(ConfigFlag(f.name, _kind(hints[f.name]), f.default, f.metadata[KEY]))
    return out


def values_of(
    cls: type, args: Any, family: Mapping[str, Any] | None = None, prefix: str = ""
) -> dict[str, Any]:
    """``field -> value`` of the flags of ``cls`` in the parsed ``args``: the flag as given;
    for one not given whose default comes from the family, ``family[prefix + field]``, else the
    field's default."""
    family = family or {}
    out = {}
    for f in flags_of(cls):
        value = getattr(args, f.dest)
        if value is None and f.flag.default_from == "family":
            value = family.get(prefix + f.field, f.default)
        out[f.field] = value
    return out


def _kind(annotation: Any) -> type:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation not in (int, float, str, bool):
        raise TypeError(f"a flag is an int, float, str or bool field, not {annotation}")
    return annotation
