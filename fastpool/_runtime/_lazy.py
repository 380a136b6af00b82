"""Modules imported on first use, so that ``import fastpool`` stays cheap.

``import fastpool`` is paid by every script that mentions the package, including the
ones that never start a pool; psutil alone costs as much as the rest of fastpool
(it is imported at the first pool). A module that needs one of these writes

    from fastpool._runtime._lazy import psutil

and uses ``psutil.Process(...)`` as before: the first attribute read imports the
real module. Only plain attribute access goes through; ``isinstance(x, psutil)``
or passing the proxy where a module is expected does not, so keep to attributes.

Thread-safe: the import system serialises the first import, and every thread
that stores the module stores the same object.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "psutil", "asyncio", "socket"]


class LazyModule:
    """Stands in for module ``name`` until an attribute is read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        # Every read goes to the module itself, never to a copy kept here, so a
        # test that monkeypatches ``psutil.Process`` is seen (about 0.3 us a read).
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


psutil: Any = LazyModule("psutil")
asyncio: Any = LazyModule("asyncio")
socket: Any = LazyModule("socket")
