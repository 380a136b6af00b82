"""Imports point one way (STYLE.md section 1): csrc <- _core <- internal modules <- pool.py, __init__.

The rules are data (``RULES``): a module's stem, what it may or must not import, and why.
Every .py, .pyx and .pxd file in the package is read, so a module added later is checked
as soon as its file exists: a rule about ``_dispatch`` or ``_verdict`` has no case until
the file is there, and then it runs, never skips. A compiled file (.pyx/.pxd) whose stem
is not in ``COMPILED_LAYERS`` fails ``test_every_compiled_file_has_a_layer``, so a new
extension module must be placed before it can be merged.

Python files are read with ``ast`` (function-level imports included); Cython files line
by line, keeping ``cimport`` (compile-time .pxd declarations) apart from ``import`` (a
module loaded at run time).
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import fastpool

PKG = Path(fastpool.__file__).parent
SOURCES = sorted(p for p in PKG.iterdir() if p.suffix in (".py", ".pyx", ".pxd"))
SUBMODULES = {p.stem for p in SOURCES if p.stem != "__init__"}


# ---- the rules --------------------------------------------------------------------------

# Compiled modules, lowest first: each may cimport the .pxd of the ones before it.
# The shared-memory layer imports nothing from fastpool at run time but errors; the
# hot paths above it may also use the codec, the call helpers and lazy imports.
COMPILED_LAYERS = ["_sys", "_shm", "_core", "_arena", "_alloc", "_task", "_dispatch", "_control", "_serve"]
SHARED_MEMORY_LAYER = frozenset({"_sys", "_shm", "_core", "_arena", "_alloc"})
HOT_PATH_IMPORTS = frozenset({"fastpool.errors", "fastpool._codec", "fastpool._call", "fastpool._lazy"})

# What the process machinery is, for the modules that must stay pure functions of their inputs.
MACHINERY = frozenset({
    "fastpool",  # the package: loads pool.py
    "fastpool.pool", "fastpool._worker", "fastpool._template", "fastpool._supervisor",
    "fastpool._core", "fastpool._arena", "fastpool._task", "fastpool._dispatch", "fastpool._control",
    "fastpool._serve", "fastpool._codec",
    "multiprocessing", "subprocess",
})

# Modules the restructuring adds (STYLE.md layout); their rules apply once their files exist.
PLANNED = frozenset({"_dispatch", "_supervisor", "_verdict", "_call", "telemetry"})

# The top of the stack: the only modules that may import the facade (the Dask plugin
# makes a Pool in each Dask worker, and the Executor is a facade of its own; the joblib
# backend and its pool cache make Pools for joblib's Parallel calls).
FACADE = frozenset({"__init__", "__main__", "_demo", "pool", "dask", "_dask_worker", "joblib",
                    "_joblib_pools"})


@dataclass(frozen=True)
class Rule:
    why: str
    stdlib_only: bool = False
    may_import: frozenset[str] | None = None  # fastpool modules allowed at run time; None: any
    may_cimport: frozenset[str] | None = None  # fastpool .pxd declarations allowed; None: any
    must_not_import: frozenset[str] = frozenset()


def _compiled_rule(stem: str) -> Rule:
    below = COMPILED_LAYERS[:COMPILED_LAYERS.index(stem)]
    if stem in SHARED_MEMORY_LAYER:
        runtime, what = frozenset({"fastpool.errors"}), "errors"
    else:
        runtime = HOT_PATH_IMPORTS | frozenset(f"fastpool.{m}" for m in below)
        what = "errors, the codec, the call helpers and the compiled modules below it"
    return Rule(
        why=f"{stem} is compiled: it sees {what} at run time and the declarations of {below or 'nothing'}",
        may_import=runtime,
        may_cimport=frozenset(f"fastpool.{m}" for m in below),
    )


RULES: list[tuple[str, Rule]] = [
    ("errors", Rule("errors sits under everything and crosses processes", stdlib_only=True)),
    *((stem, _compiled_rule(stem)) for stem in COMPILED_LAYERS),
    *((stem, Rule("policy, sizing, memory and verdicts are pure: tested without processes",
                  must_not_import=MACHINERY))
      for stem in ("_policy", "_sizing", "_memory", "_verdict")),
    *((stem, Rule("the parent never imports the worker's loop",
                  must_not_import=frozenset({"fastpool._worker", "fastpool._serve"})))
      for stem in ("pool", "_supervisor", "_task", "_dispatch", "_control", "telemetry")),
    *((stem, Rule("internal modules sit under the facade",
                  must_not_import=frozenset({"fastpool", "fastpool.pool"})))
      for stem in sorted((SUBMODULES | PLANNED) - FACADE)),
]

# (file, forbidden import) pairs known to break a rule today, with the change that
# fixes them. Strict xfail: the day the import goes, the test fails until the entry goes.
PENDING: dict[tuple[str, str], str] = {}


# ---- reading imports --------------------------------------------------------------------


@dataclass(frozen=True)
class Imports:
    runtime: frozenset[str]  # modules loaded when this one runs
    cimports: frozenset[str]  # .pxd declarations read at compile time (Cython only)


def _resolve(module: str | None, level: int, names: list[str]) -> set[str]:
    """The modules one import statement names, as dotted names (fastpool.X for submodules).

    Every module checked here sits directly in the package, so a relative import
    (``from . import errors``, ``from .errors import X``) is relative to fastpool."""
    if level:
        module = ".".join(["fastpool"] + ([module] if module else []))
    assert module is not None
    if module == "fastpool":
        # `from fastpool import errors` loads the submodule; `from fastpool import Pool`
        # loads the package itself (and with it pool.py).
        return {f"fastpool.{n}" if n in SUBMODULES else "fastpool" for n in names}
    return {module}


def python_imports(path: Path) -> Imports:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= _resolve(node.module, node.level, [a.name for a in node.names])
    return Imports(frozenset(found), frozenset())


_PYX_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+(c?import)\s+(.+)$")
_PYX_IMPORT = re.compile(r"^\s*(c?import)\s+(.+)$")


_IMPORT_START = re.compile(r"^\s*(from\s|c?import\s)")


def _logical_lines(text: str):
    """Source lines with comments cut, and an import's parenthesised or continued name list joined."""
    lines = iter(text.splitlines())
    for line in lines:
        line = line.split("#", 1)[0].rstrip()
        while _IMPORT_START.match(line) and (line.endswith("\\") or line.count("(") > line.count(")")):
            nxt = next(lines, None)
            if nxt is None:
                break
            line = line.rstrip("\\") + " " + nxt.split("#", 1)[0].strip()
        yield line


def cython_imports(path: Path) -> Imports:
    runtime: set[str] = set()
    cimports: set[str] = set()
    for line in _logical_lines(path.read_text()):
        if m := _PYX_FROM.match(line):
            dots, module, kind, names = m.groups()
            listed = [n.strip().split(" as ")[0].strip("() ") for n in names.split(",")]
            mods = _resolve(module or None, len(dots), [n for n in listed if n])
        elif m := _PYX_IMPORT.match(line):
            kind = m.group(1)
            mods = {n.strip().split(" as ")[0].strip() for n in m.group(2).split(",")}
        else:
            continue
        (cimports if kind == "cimport" else runtime).update(mods)
    return Imports(frozenset(runtime), frozenset(cimports))


def imports_of(path: Path) -> Imports:
    return python_imports(path) if path.suffix == ".py" else cython_imports(path)


def fastpool_modules(names: frozenset[str]) -> set[str]:
    return {m for m in names if m == "fastpool" or m.startswith("fastpool.")}


# ---- the readers work -----------------------------------------------------------------------


def test_the_python_reader_sees_known_imports() -> None:
    # The claims below are about absences; these show the readers do find things.
    found = python_imports(PKG / "pool.py").runtime
    assert {"fastpool._core", "fastpool.errors", "fastpool._policy"} <= found


def test_the_cython_reader_tells_cimports_from_imports(tmp_path: Path) -> None:
    src = tmp_path / "_sample.pyx"
    src.write_text(
        "import os  # from fastpool import pool\n"
        "from libc.stdint cimport uint32_t\n"
        "from fastpool import errors\n"
        "from fastpool._sys cimport (\n"
        "    fp_ring_t,\n"
        "    fp_board_t,   # a comment inside the list\n"
        ")\n"
        "from . cimport _core\n"
        "cimport fastpool._arena as arena\n"
        "from fastpool._template \\\n"
        "    import template\n"
        "    from fastpool import _worker\n"  # an import inside a function
    )
    found = cython_imports(src)
    assert found.runtime == {"os", "fastpool.errors", "fastpool._template", "fastpool._worker"}
    assert found.cimports == {"libc.stdint", "fastpool._sys", "fastpool._core", "fastpool._arena"}


def test_python_and_cython_sources_are_all_found() -> None:
    assert {".py", ".pyx", ".pxd"} <= {p.suffix for p in SOURCES}
    assert {"errors.py", "_core.pyx", "_arena.pyx", "_sys.pxd"} <= {p.name for p in SOURCES}


def test_every_compiled_file_has_a_layer() -> None:
    compiled = {p.name for p in SOURCES if p.suffix in (".pyx", ".pxd")}
    unplaced = {name for name in compiled if Path(name).stem not in COMPILED_LAYERS}
    assert unplaced == set(), f"add these to COMPILED_LAYERS in {__file__}"


# ---- the rules hold --------------------------------------------------------------------------


def _cases() -> list:
    cases = []
    for path in SOURCES:
        for stem, rule in RULES:
            if path.stem != stem:
                continue
            pending = [why for (name, mod), why in PENDING.items()
                       if name == path.name and mod in rule.must_not_import]
            marks = [pytest.mark.xfail(strict=True, reason="; ".join(pending))] if pending else []
            cases.append(pytest.param(path, rule, id=f"{path.name}: {rule.why}", marks=marks))
    return cases


@pytest.mark.parametrize("path, rule", _cases())
def test_imports_follow_the_layering(path: Path, rule: Rule) -> None:
    found = imports_of(path)
    own = {f"fastpool.{path.stem}"}  # a .pyx cimports its own .pxd
    if rule.stdlib_only:
        outside = {m for m in found.runtime if m.split(".")[0] not in sys.stdlib_module_names}
        assert outside - {"__future__"} == set(), rule.why
    if rule.may_import is not None:
        assert fastpool_modules(found.runtime) - rule.may_import == set(), rule.why
    if rule.may_cimport is not None:
        assert fastpool_modules(found.cimports) - rule.may_cimport - own == set(), rule.why
    assert (found.runtime | found.cimports) & rule.must_not_import == set(), rule.why


def test_the_rules_name_real_modules_or_planned_ones() -> None:
    assert {stem for stem, _ in RULES} <= SUBMODULES | PLANNED
    assert {name for name, _ in PENDING} <= {p.name for p in SOURCES}


@pytest.mark.parametrize("name, text", [
    ("errors.py", "import numpy\n"),
    ("_core.pyx", "from fastpool._arena cimport Arena\n"),  # a cimport of a layer above
    ("_core.pxd", "from fastpool import _codec\n"),
    ("_arena.pyx", "from fastpool._dispatch cimport Dispatcher\n"),
    ("_sys.pxd", "from fastpool._core cimport Board\n"),
    ("_memory.py", "def f():\n    from fastpool import _template\n"),
    ("_verdict.py", "import subprocess\n"),
    ("_dispatch.pyx", "from fastpool._worker import main\n"),
    ("telemetry.py", "from fastpool import Pool\n"),
])
def test_a_broken_rule_is_caught(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    rules = [rule for stem, rule in RULES if stem == path.stem]
    assert rules, f"no rule covers {name}"
    broken = 0
    for rule in rules:
        try:
            test_imports_follow_the_layering(path, rule)
        except AssertionError:
            broken += 1
    assert broken
