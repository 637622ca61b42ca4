"""A package's names resolved on first use (PEP 562 ``__getattr__``), so importing the package costs
only its ``__init__``: a warm probe sends its request before the CLI's imports, and ``analyze --json``
never loads what only the cards, the inventory's parsers or the keeper's server need."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def resolver(package: str, owners: Mapping[str, str], submodules: Iterable[str] = ()) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name in ``owners`` is imported from its module and kept on
    the package (one import per name); a name in ``submodules`` is that submodule."""
    rooms = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in rooms:
            return importlib.import_module(f"{package}.{name}")
        owner = owners.get(name)
        if owner is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{owner}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
