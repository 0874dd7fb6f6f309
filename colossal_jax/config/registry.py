"""A table of registered objects of one kind (tensor modes, sequence modes, pipeline schedules,
optimizers), the live view of its names, and the lazy reference to code on an upper floor.

Each kind is a frozen dataclass with a ``name`` and a ``help`` line, held in one
:class:`Registry`; the configuration floor registers the built-in ones and anyone may add more
(a test, a notebook, another package) with :meth:`Registry.register`. What an object runs (a
layout class, an attention kernel, an optax transform, a schedule's order) lives on a floor above
this one, so it is named by a ``"package.module:Name"`` string imported on first use
(:func:`resolve`), or given as the callable itself.

Nothing here imports JAX.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from colossal_jax.config.errors import ConfigError, choice


class Named(Protocol):
    """What every registered object has."""

    @property
    def name(self) -> str: ...

    @property
    def help(self) -> str: ...


T = TypeVar("T", bound=Named)

Reference = str | Callable[..., Any]
"""Code on an upper floor: ``"package.module:Name"`` (imported on first use) or the object."""


def resolve(ref: Reference) -> Any:
    """The object ``ref`` names: imported from ``"package.module:Name"``, or ``ref`` itself."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"{ref!r} is not a 'package.module:Name' reference")
    return getattr(importlib.import_module(module), attr)


class Names(Sequence[str]):
    """A live, read-only view of a registry's names, in registration order (optionally only
    those of objects ``where`` accepts): ``name in view``, iteration and ``", ".join(view)``
    see objects registered after the view was made."""

    def __init__(self, registry: Registry[Any], where: Callable[[Any], bool] | None = None):
        self._registry = registry
        self._where = where

    def _names(self) -> tuple[str, ...]:
        return tuple(
            item.name for item in self._registry if self._where is None or self._where(item)
        )

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __repr__(self) -> str:
        return repr(self._names())


class Registry(Generic[T]):
    """The registered objects of one kind, by name, in registration order.

    Args:
      kind: what the objects are, as messages name them (``tensor mode``).
      flag: the command-line flag that chooses one (``--tensor-mode``), for the message of an
        unknown name.
    """

    def __init__(self, kind: str, flag: str):
        self.kind = kind
        self.flag = flag
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Add ``item`` (a name already registered is an error) and return it."""
        if item.name in self._items:
            raise ValueError(f"{self.kind} {item.name!r} is registered twice")
        self._items[item.name] = item
        return item

    def unregister(self, name: str) -> None:
        """Remove the object ``name`` (a test's own, when it is done)."""
        del self._items[name]

    def get(self, name: str) -> T:
        """The object ``name``; :class:`ConfigError` names the registered ones."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ConfigError(choice(self.flag, name, self.names())) from None

    def find(self, name: str) -> T | None:
        """The object ``name``, or None where none is registered (a name read from a file)."""
        return self._items.get(name)

    def names(self, where: Callable[[T], bool] | None = None) -> Names:
        """A live view of the registered names (those ``where`` accepts)."""
        return Names(self, where)

    def __iter__(self) -> Iterator[T]:
        return iter(tuple(self._items.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._items
