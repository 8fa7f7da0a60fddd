"""Name -> implementation registries for codecs, transports, tracers (papermill-style).

Register by name, look up by name; an unknown name raises :class:`UnknownNameError` listing the known
ones. Third parties plug in through the entry-point group ``picklescope.<kind>s`` without editing
this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from picklescope.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered mapping from a name to an object, with plug-ins loaded on first lookup."""

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group or f"picklescope.{kind}s"
        self._items: dict[str, T] = {}
        self._providers: list[Callable[[], dict[str, T]]] = []
        self._plugins_loaded = False

    def register(self, name: str, item: T, *, replace: bool = False) -> T:
        """Add ``item`` under ``name``; a second registration of a name needs ``replace=True``."""
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def add_provider(self, provider: Callable[[], dict[str, T]] | str) -> None:
        """Register a function that lists dynamic entries (e.g. installed verl versions) on lookup.

        The function may be named as ``"module:function"``, the form of an entry point's value: the module
        is imported on the first lookup, so a registry can list entries of a package that itself imports
        the registry (the real-verl codecs use the codec base classes) without an import cycle.
        """
        self._providers.append(provider if callable(provider) else _named(provider))

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.group):
            if ep.name not in self._items:
                self._items[ep.name] = ep.load()

    def _all(self) -> dict[str, T]:
        self._load_plugins()
        items = dict(self._items)
        for provider in self._providers:
            for name, item in provider().items():
                items.setdefault(name, item)
        return items

    def get(self, name: str) -> T:
        """The item called ``name``, or an error that lists every known name."""
        items = self._all()
        if name not in items:
            raise UnknownNameError(self.kind, name, list(items))
        return items[name]

    def names(self) -> list[str]:
        return list(self._all())

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())


def _named(target: str) -> Callable[[], dict]:
    """The function ``"module:function"`` names, resolved with :func:`importlib.import_module` when first called."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ValueError(f"a provider is named 'module:function', not {target!r}")

    def provider() -> dict:
        return getattr(importlib.import_module(module), attr)()

    provider.__qualname__ = target
    return provider
