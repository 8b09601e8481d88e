"""Documented registries: config names -> classes, in the style of detectron2.

A :class:`Registry` is a read-only mapping from the ``type`` names a config
may use to the classes they build, plus a sentence saying what it holds.
Classes join with the :meth:`Registry.register` decorator in the module that
defines them; a package outside ``opencood_ext`` (GenComm, for example)
registers its classes when it is imported. :func:`opencood_ext.models.build`
turns a spec ``{type: name, **args}`` into an instance, checking the keys
against the constructor.

    LINKS = Registry("link", "intermediate-fusion links (model.link.type)")

    @LINKS.register("full_feature")
    class FullFeatureLink(nn.Module): ...
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Callable, Dict, Iterator, Optional


class Registry(Mapping):
    """``name`` names what the registry holds (used in errors); ``doc`` says what it is for."""

    def __init__(self, name: str, doc: str = "", entries: Optional[Dict[str, type]] = None):
        self.name = name
        self.doc = doc
        self._entries: Dict[str, type] = {}
        for key, cls in (entries or {}).items():
            self.add(key, cls)

    def add(self, key: str, cls: type) -> type:
        """Register ``cls`` under ``key``; a second, different class under the same key is refused."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"{self.name} registry: key must be a non-empty string, got {key!r}")
        if key in self._entries and self._entries[key] is not cls:
            raise ValueError(f"{self.name} registry: '{key}' is already {self._entries[key].__qualname__}")
        self._entries[key] = cls
        return cls

    def register(self, key: str) -> Callable[[type], type]:
        """Class decorator: ``@REG.register("name")``."""
        return lambda cls: self.add(key, cls)

    def get_class(self, key: str, where: str = "") -> type:
        """The class for ``key``; an unknown key raises ValueError with the closest name."""
        if key not in self._entries:
            close = difflib.get_close_matches(str(key), list(self._entries), n=1, cutoff=0.5)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"{where or self.name}: unknown {self.name} '{key}'{hint}; registered: "
                             f"{sorted(self._entries)}")
        return self._entries[key]

    def __getitem__(self, key: str) -> type:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}: {sorted(self._entries)})"
