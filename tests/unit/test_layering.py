"""Imports point one way (STYLE.md section 1): errors under everything, _core over errors only,
the pure policy modules under the process machinery.

Python modules are read with ``ast`` (function-level imports included); ``_core.pyx``
is Cython, which ``ast`` cannot parse, so its import statements are read line by line.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import fastpool

PKG = Path(fastpool.__file__).parent
SUBMODULES = {p.stem for p in PKG.iterdir() if p.suffix in (".py", ".pyx") and p.stem != "__init__"}


def _resolve(module: str | None, level: int, names: list[str]) -> set[str]:
    """The modules one import statement loads, as dotted names (fastpool.X for submodules).

    Every module checked here sits directly in the package, so a relative import
    (``from . import errors``, ``from .errors import X``) is relative to fastpool."""
    if level:
        module = ".".join(["fastpool"] + ([module] if module else []))
    assert module is not None
    out = {module}
    if module == "fastpool":
        # `from fastpool import errors` loads the submodule; `from fastpool import Pool`
        # loads the package itself (and with it pool.py).
        out = {f"fastpool.{n}" if n in SUBMODULES else "fastpool" for n in names}
    return out


def python_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= _resolve(node.module, node.level, [a.name for a in node.names])
    return found


_PYX_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+c?import\s+(.+)$")
_PYX_IMPORT = re.compile(r"^\s*c?import\s+(.+)$")


def cython_imports(path: Path) -> set[str]:
    found: set[str] = set()
    lines = iter(path.read_text().splitlines())
    for line in lines:
        line = line.split("#", 1)[0].rstrip()
        if line.endswith("(") or line.endswith("\\"):  # parenthesised or continued name list
            while not line.rstrip().endswith(")"):
                nxt = next(lines, ")")
                line = line.rstrip("\\") + " " + nxt.split("#", 1)[0].strip()
        if m := _PYX_FROM.match(line):
            dots, module, names = m.groups()
            names = [n.strip().split(" as ")[0].strip("() ") for n in names.split(",")]
            found |= _resolve(module or None, len(dots), [n for n in names if n])
        elif m := _PYX_IMPORT.match(line):
            found |= {n.strip().split(" as ")[0].strip() for n in m.group(1).split(",")}
    return found


def fastpool_modules(imports: set[str]) -> set[str]:
    return {m for m in imports if m == "fastpool" or m.startswith("fastpool.")}


def test_the_import_readers_see_known_imports() -> None:
    # The claims below are about absences; this one shows the readers do find things.
    assert {"fastpool._core", "fastpool.errors", "fastpool._policy"} <= python_imports(PKG / "pool.py")
    core = cython_imports(PKG / "_core.pyx")
    assert "fastpool.errors" in core
    assert "libc.stdint" in core


def test_errors_imports_only_the_standard_library() -> None:
    imports = python_imports(PKG / "errors.py")
    assert imports, "errors.py imports nothing? the reader is broken"
    outside = {m for m in imports if m.split(".")[0] not in sys.stdlib_module_names}
    assert outside == set()


@pytest.mark.parametrize("source", ["_core.pyx", "_core.pxd"])
def test_core_imports_nothing_from_fastpool_but_errors(source: str) -> None:
    path = PKG / source
    if not path.exists():
        pytest.skip(f"{source} does not exist in this tree")
    # _sys.pxd holds C declarations only (csrc and libc): it sits below _core, and a
    # cimport of it imports nothing at run time.
    assert fastpool_modules(cython_imports(path)) <= {"fastpool.errors", "fastpool._sys"}


MACHINERY = {"fastpool", "fastpool.pool", "fastpool._worker", "fastpool._template", "fastpool._core"}


@pytest.mark.parametrize("module", ["_policy.py", "_sizing.py", "_memory.py"])
def test_pure_modules_do_not_import_the_process_machinery(module: str) -> None:
    assert fastpool_modules(python_imports(PKG / module)) & MACHINERY == set()
