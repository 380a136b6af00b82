"""Imports point one way, and the folders show the layers (STYLE.md section 1).

    fastpool/errors.py          under everything; the standard library only
    fastpool/_native/           the shared-memory core: board and rings, arena, allocator hook
    fastpool/_runtime/          what runs tasks: task records, dispatcher, codec, worker loop,
                                the template that forks workers
    fastpool/_supervision/      worker processes, deaths, memory, policy, verdicts, sizing
    fastpool/telemetry.py       stats and crash records, fed by supervision
    fastpool/_integrations/     asyncio, progress, the Dask worker side
    fastpool/pool.py, __init__, dask.py ...   the public facades
    fastpool/cli/, _bench/      the tools

A module may import (or cimport) only modules of its own layer or the layers below
(``LAYERS``), except for the few edges in ``UPWARD`` each with its reason. The finer rules
(``RULES``) keep the compiled modules in cimport order, the pure modules free of process
machinery, and the worker's loop out of the parent. Every .py, .pyx and .pxd file in the
package, sub-packages included, is read, so a module added later is checked as soon as its
file exists; a compiled file (.pyx/.pxd) missing from ``COMPILED_LAYERS`` fails
``test_every_compiled_file_has_a_layer``, so a new extension must be placed before merging.

Two rules hold the shape of the integrations (issue 23): only the codec room ships a call
(no module under _integrations, nor joblib.py, mp.py or dask*.py, imports pickle or
cloudpickle), and nothing outside fastpool/_runtime reads a dispatcher's ``_disp`` but the
facade that owns it (``DISP_OWNERS``).

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
SOURCES = sorted(p for p in PKG.rglob("*") if p.suffix in (".py", ".pyx", ".pxd"))


def module_of(path: Path) -> str:
    """The dotted name of a source file: fastpool/_native/_core.pyx -> fastpool._native._core."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["fastpool", *parts])


MODULES = frozenset(module_of(p) for p in SOURCES)


# ---- the rules --------------------------------------------------------------------------

# Layers, lowest first, by the first name under fastpool.
LAYERS: dict[str, int] = {
    "errors": 0,
    "_native": 1,
    "_runtime": 2,
    "_supervision": 3,
    "telemetry": 3,
    "_integrations": 4,
    "pool": 5,
    "_pool_options": 5,
    "__init__": 5,
    "__main__": 5,
    "dask": 5,
    "joblib": 5,
    "mp": 5,
    "cli": 6,
    "_bench": 6,
}

# Edges against the grain, each with the reason it is allowed.
UPWARD: dict[tuple[str, str], str] = {
    (
        "fastpool._runtime._call",
        "fastpool._supervision._policy",
    ): "a call's options (TaskOptions) are pure policy data, no process machinery",
    (
        "fastpool._integrations._dask_worker",
        "fastpool.pool",
    ): "the Dask plugin makes a Pool in each Dask worker",
    ("fastpool._integrations._joblib_pools", "fastpool.pool"): (
        "the joblib backend's pool cache makes and retires Pools"
    ),
    ("fastpool.__main__", "fastpool.cli"): "python -m fastpool is the CLI",
}


def layer_of(module: str) -> int | None:
    if module == "fastpool":
        return LAYERS["__init__"]
    return LAYERS.get(module.split(".")[1])


def _setup_modules() -> list[str]:
    """setup.py's MODULES: the extensions it builds, in cimport order (read, not run)."""
    tree = ast.parse((PKG.parent / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no MODULES")


# Compiled modules, lowest first: each may cimport the .pxd of the ones before it. The
# declaration-only .pxd files come first; the extensions follow in setup.py's build order,
# the one list of them. The shared-memory layer imports nothing from fastpool at run time
# but errors; the hot paths above it may also use the codec, the call helpers and lazy
# imports.
COMPILED_LAYERS = ["fastpool._native._sys", "fastpool._native._shm", *_setup_modules()]
SHARED_MEMORY_LAYER = frozenset(m for m in COMPILED_LAYERS if m.startswith("fastpool._native."))
HOT_PATH_IMPORTS = frozenset(
    {
        "fastpool.errors",
        "fastpool._runtime._codec",
        "fastpool._runtime._call",
        "fastpool._runtime._lazy",
        "fastpool._runtime._arrays",
        "fastpool._runtime._events",
    }
)

# What the process machinery is, for the modules that must stay pure functions of their inputs.
MACHINERY = frozenset(
    {
        "fastpool",  # the package: loads pool.py
        "fastpool.pool",
        "fastpool._supervision._lifetime",
        "fastpool._runtime._worker",
        "fastpool._runtime._template",
        "fastpool._supervision._supervisor",
        "fastpool._native._core",
        "fastpool._native._arena",
        "fastpool._runtime._task",
        "fastpool._runtime._dispatch",
        "fastpool._runtime._controls",
        "fastpool._runtime._slots",
        "fastpool._runtime._serve",
        "fastpool._runtime._codec",
        "multiprocessing",
        "subprocess",
    }
)
PURE = (
    "fastpool._supervision._policy",
    "fastpool._supervision._sizing",
    "fastpool._supervision._memory",
    "fastpool._supervision._verdict",
    "fastpool._supervision._deaths",
    "fastpool._supervision._watch",
    "fastpool._supervision._slot",
)
PARENT = (
    "fastpool.pool",
    "fastpool._supervision._lifetime",
    "fastpool._supervision._supervisor",
    "fastpool._runtime._task",
    "fastpool._runtime._slots",
    "fastpool._runtime._dispatch",
    "fastpool._runtime._controls",
    "fastpool.telemetry",
)

# The top of the stack: the only modules that may import the facade (the Dask plugin
# makes a Pool in each Dask worker, and the other facades wrap a Pool).
FACADE = frozenset(
    {
        "fastpool",
        "fastpool.__main__",
        "fastpool.pool",
        "fastpool.dask",
        "fastpool.joblib",
        "fastpool.mp",
        "fastpool._integrations._dask_worker",
        "fastpool._integrations._joblib_pools",
    }
)


@dataclass(frozen=True)
class Rule:
    why: str
    stdlib_only: bool = False
    may_import: frozenset[str] | None = None  # fastpool modules allowed at run time; None: any
    may_cimport: frozenset[str] | None = None  # fastpool .pxd declarations allowed; None: any
    must_not_import: frozenset[str] = frozenset()


def _compiled_rule(module: str) -> Rule:
    below = COMPILED_LAYERS[: COMPILED_LAYERS.index(module)]
    if module in SHARED_MEMORY_LAYER:
        runtime, what = frozenset({"fastpool.errors"}), "errors"
    else:
        runtime = HOT_PATH_IMPORTS | frozenset(below)
        what = "errors, the codec, the call helpers and the compiled modules below it"
    return Rule(
        why=f"{module} is compiled: it sees {what} at run time and the declarations of "
        f"{[m.rsplit('.', 1)[1] for m in below] or 'nothing'}",
        may_import=runtime,
        may_cimport=frozenset(below),
    )


RULES: list[tuple[str, Rule]] = [
    (
        "fastpool.errors",
        Rule("errors sits under everything and crosses processes", stdlib_only=True),
    ),
    *((m, _compiled_rule(m)) for m in COMPILED_LAYERS),
    *(
        (
            m,
            Rule(
                "policy, sizing, memory, verdicts, deaths, watch and slot records are pure: "
                "tested without processes",
                must_not_import=MACHINERY,
            ),
        )
        for m in PURE
    ),
    *(
        (
            m,
            Rule(
                "the parent never imports the worker's loop",
                must_not_import=frozenset(
                    {"fastpool._runtime._worker", "fastpool._runtime._serve"}
                ),
            ),
        )
        for m in PARENT
    ),
    *(
        (
            m,
            Rule(
                "internal modules sit under the facade",
                must_not_import=frozenset({"fastpool", "fastpool.pool"}),
            ),
        )
        for m in sorted(MODULES - FACADE)
        if layer_of(m) is not None and layer_of(m) < LAYERS["pool"]
    ),
]

# (module, forbidden import) pairs known to break a rule today, with the change that
# fixes them. Strict xfail: the day the import goes, the test fails until the entry goes.
PENDING: dict[tuple[str, str], str] = {}


# ---- reading imports --------------------------------------------------------------------


@dataclass(frozen=True)
class Imports:
    runtime: frozenset[str]  # modules loaded when this one runs
    cimports: frozenset[str]  # .pxd declarations read at compile time (Cython only)


def _resolve(
    module: str | None, level: int, names: list[str], package: str = "fastpool"
) -> set[str]:
    """The modules one import statement names, as dotted names.

    ``from fastpool._runtime import _codec`` names the submodule ``fastpool._runtime._codec``;
    ``from fastpool import Pool`` names the package itself (and with it pool.py). A relative
    import is relative to ``package``, the importing file's own package."""
    if level:
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        module = ".".join(base + ([module] if module else []))
    assert module is not None
    if module == "fastpool" or module in MODULES:
        subs = {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
        return subs | ({module} if len(subs) < len(names) else set())
    return {module}


def python_imports(path: Path, package: str = "fastpool") -> Imports:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= _resolve(node.module, node.level, [a.name for a in node.names], package)
    return Imports(frozenset(found), frozenset())


_PYX_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+(c?import)\s+(.+)$")
_PYX_IMPORT = re.compile(r"^\s*(c?import)\s+(.+)$")


_IMPORT_START = re.compile(r"^\s*(from\s|c?import\s)")


def _logical_lines(text: str):
    """Source lines with comments cut; an import's parenthesised or continued names joined."""
    lines = iter(text.splitlines())
    for line in lines:
        line = line.split("#", 1)[0].rstrip()
        while _IMPORT_START.match(line) and (
            line.endswith("\\") or line.count("(") > line.count(")")
        ):
            nxt = next(lines, None)
            if nxt is None:
                break
            line = line.rstrip("\\") + " " + nxt.split("#", 1)[0].strip()
        yield line


def cython_imports(path: Path, package: str = "fastpool") -> Imports:
    runtime: set[str] = set()
    cimports: set[str] = set()
    for line in _logical_lines(path.read_text()):
        if m := _PYX_FROM.match(line):
            dots, module, kind, names = m.groups()
            listed = [n.strip().split(" as ")[0].strip("() ") for n in names.split(",")]
            mods = _resolve(module or None, len(dots), [n for n in listed if n], package)
        elif m := _PYX_IMPORT.match(line):
            kind = m.group(1)
            mods = {n.strip().split(" as ")[0].strip() for n in m.group(2).split(",")}
        else:
            continue
        (cimports if kind == "cimport" else runtime).update(mods)
    return Imports(frozenset(runtime), frozenset(cimports))


def imports_of(path: Path, module: str | None = None) -> Imports:
    module = module_of(path) if module is None else module
    package = module if path.stem == "__init__" else module.rsplit(".", 1)[0]
    read = python_imports if path.suffix == ".py" else cython_imports
    return read(path, package)


def fastpool_modules(names: frozenset[str]) -> set[str]:
    return {m for m in names if m == "fastpool" or m.startswith("fastpool.")}


# ---- the readers work -----------------------------------------------------------------------


def test_the_python_reader_sees_known_imports() -> None:
    # The claims below are about absences; these show the readers do find things.
    found = python_imports(PKG / "pool.py").runtime
    assert {
        "fastpool._native._ndarray",
        "fastpool.errors",
        "fastpool._supervision._policy",
    } <= found
    assert "fastpool._runtime" not in found  # `from fastpool._runtime import _codec` names _codec


def test_the_cython_reader_tells_cimports_from_imports(tmp_path: Path) -> None:
    src = tmp_path / "_sample.pyx"
    src.write_text(
        "import os  # from fastpool import pool\n"
        "from libc.stdint cimport uint32_t\n"
        "from fastpool import errors\n"
        "from fastpool._native._sys cimport (\n"
        "    fp_ring_t,\n"
        "    fp_board_t,   # a comment inside the list\n"
        ")\n"
        "from . cimport _core\n"
        "cimport fastpool._native._arena as arena\n"
        "from fastpool._runtime._template \\\n"
        "    import template\n"
        "    from fastpool._runtime import _worker\n"  # an import inside a function
    )
    found = cython_imports(src, "fastpool._native")
    assert found.runtime == {
        "os",
        "fastpool.errors",
        "fastpool._runtime._template",
        "fastpool._runtime._worker",
    }
    assert found.cimports == {
        "libc.stdint",
        "fastpool._native._sys",
        "fastpool._native._core",
        "fastpool._native._arena",
    }


def test_python_and_cython_sources_are_all_found() -> None:
    assert {".py", ".pyx", ".pxd"} <= {p.suffix for p in SOURCES}
    assert {
        "fastpool.errors",
        "fastpool._native._core",
        "fastpool._native._arena",
        "fastpool._native._sys",
        "fastpool._runtime._dispatch",
    } <= MODULES


def test_every_compiled_file_has_a_layer() -> None:
    compiled = {module_of(p) for p in SOURCES if p.suffix in (".pyx", ".pxd")}
    assert compiled - set(COMPILED_LAYERS) == set(), f"add these to COMPILED_LAYERS in {__file__}"


def test_every_module_sits_in_a_layer() -> None:
    assert {m for m in MODULES if layer_of(m) is None} == set(), f"add them to LAYERS in {__file__}"


# ---- the rules hold --------------------------------------------------------------------------


def _cases() -> list:
    cases = []
    for path in SOURCES:
        for module, rule in RULES:
            if module_of(path) != module:
                continue
            pending = [
                why
                for (name, mod), why in PENDING.items()
                if name == module and mod in rule.must_not_import
            ]
            marks = [pytest.mark.xfail(strict=True, reason="; ".join(pending))] if pending else []
            cases.append(
                pytest.param(path, module, rule, id=f"{path.name}: {rule.why}", marks=marks)
            )
    return cases


@pytest.mark.parametrize("path, module, rule", _cases())
def test_imports_follow_the_rules(path: Path, module: str, rule: Rule) -> None:
    found = imports_of(path, module)
    own = {module}  # a .pyx cimports its own .pxd
    if rule.stdlib_only:
        outside = {m for m in found.runtime if m.split(".")[0] not in sys.stdlib_module_names}
        assert outside - {"__future__"} == set(), rule.why
    if rule.may_import is not None:
        assert fastpool_modules(found.runtime) - rule.may_import == set(), rule.why
    if rule.may_cimport is not None:
        assert fastpool_modules(found.cimports) - rule.may_cimport - own == set(), rule.why
    assert (found.runtime | found.cimports) & rule.must_not_import == set(), rule.why


def _upward(path: Path, module: str) -> set[str]:
    found = imports_of(path, module)
    mine = layer_of(module)
    assert mine is not None, module
    return {
        m
        for m in fastpool_modules(found.runtime | found.cimports)
        if (layer_of(m) or 0) > mine and (module, m) not in UPWARD
    }


@pytest.mark.parametrize("path", SOURCES, ids=[module_of(p) for p in SOURCES])
def test_imports_point_down_the_layers(path: Path) -> None:
    assert _upward(path, module_of(path)) == set(), "an import against the layers: see LAYERS"


def test_the_rules_name_real_modules() -> None:
    assert {m for m, _ in RULES} <= MODULES
    assert {a for a, _ in UPWARD} <= MODULES
    assert {name for name, _ in PENDING} <= MODULES


@pytest.mark.parametrize(
    "module, suffix, text",
    [
        ("fastpool.errors", ".py", "import numpy\n"),
        ("fastpool._native._core", ".pyx", "from fastpool._native._arena cimport Arena\n"),
        ("fastpool._native._core", ".pxd", "from fastpool._runtime import _codec\n"),
        ("fastpool._native._arena", ".pyx", "from fastpool._runtime._dispatch cimport Dispatch\n"),
        ("fastpool._native._sys", ".pxd", "from fastpool._native._core cimport Board\n"),
        (
            "fastpool._supervision._memory",
            ".py",
            "def f():\n    from fastpool._runtime import _template\n",
        ),
        ("fastpool._supervision._verdict", ".py", "import subprocess\n"),
        ("fastpool._runtime._dispatch", ".pyx", "from fastpool._runtime._worker import main\n"),
        ("fastpool.telemetry", ".py", "from fastpool import Pool\n"),
    ],
)
def test_a_broken_rule_is_caught(tmp_path: Path, module: str, suffix: str, text: str) -> None:
    path = tmp_path / (module.rsplit(".", 1)[1] + suffix)
    path.write_text(text)
    rules = [rule for name, rule in RULES if name == module]
    assert rules, f"no rule covers {module}"
    broken = 0
    for rule in rules:
        try:
            test_imports_follow_the_rules(path, module, rule)
        except AssertionError:
            broken += 1
    assert broken


@pytest.mark.parametrize(
    "module, text",
    [
        ("fastpool._native._arena", "from fastpool._supervision import _sizing\n"),
        ("fastpool._runtime._codec", "from fastpool._integrations import _progress\n"),
        ("fastpool._supervision._supervisor", "import fastpool.cli\n"),
    ],
)
def test_an_import_against_the_layers_is_caught(tmp_path: Path, module: str, text: str) -> None:
    path = tmp_path / "sample.py"
    path.write_text(text)
    assert _upward(path, module)


# ---- one room ships a call -----------------------------------------------------------------

# The codec (fastpool/_runtime/_codec.py, with _mainns and _arrays) encodes every call: the
# integrations and facades that translate onto the pool hand it objects and never pickle a
# call themselves (issue 23: each shipped its own, and each had its own idea of __main__).
PICKLERS = frozenset({"pickle", "_pickle", "cloudpickle"})


def ships_calls_itself(module: str) -> bool:
    name = module.split(".")
    return (
        name[1:2] == ["_integrations"]
        or name[1:2] in (["joblib"], ["mp"])
        or (len(name) > 1 and name[1].startswith("dask"))
    )


SHIPPERS = sorted(p for p in SOURCES if ships_calls_itself(module_of(p)))


def picklers_named(path: Path) -> set[str]:
    """The pickle modules an import names, by any route: ``import pickle``, ``from
    cloudpickle import dumps``, ``from joblib.externals import cloudpickle``, in a function
    too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            dotted = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {part for name in dotted for part in name.split(".")} & PICKLERS
    return found


def test_the_shippers_are_found() -> None:
    names = {module_of(p) for p in SHIPPERS}
    assert {
        "fastpool.joblib",
        "fastpool.mp",
        "fastpool.dask",
        "fastpool._integrations._joblib_task",
        "fastpool._integrations._dask_child",
    } <= names
    assert "fastpool._runtime._codec" not in names


@pytest.mark.parametrize("path", SHIPPERS, ids=[module_of(p) for p in SHIPPERS])
def test_only_the_codec_ships_a_call(path: Path, module: str | None = None) -> None:
    assert picklers_named(path) == set(), (
        f"{module or module_of(path)} imports a pickler: hand the pool objects, its codec "
        "ships them"
    )


# Who may name a dispatcher's ``_disp``: the runtime that defines it, and the facade that
# owns one per pool. Everything else asks the Pool's own methods (Pool._closed(), ...).
DISP_OWNERS: dict[str, str] = {
    "fastpool.pool": "the facade holds the pool's dispatcher and forwards to it",
}


def reads_disp(path: Path) -> bool:
    text = path.read_text()
    if path.suffix != ".py":
        return re.search(r"\._disp\b|[\"']_disp[\"']", text) is not None
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "_disp":
            return True
        if isinstance(node, ast.Constant) and node.value == "_disp":  # getattr(pool, "_disp")
            return True
    return False


def _disp_readers_may(module: str) -> bool:
    return module.startswith("fastpool._runtime.") or module in DISP_OWNERS


@pytest.mark.parametrize("path", SOURCES, ids=[module_of(p) for p in SOURCES])
def test_nothing_outside_the_runtime_reads_disp(path: Path, module: str | None = None) -> None:
    module = module or module_of(path)
    assert _disp_readers_may(module) or not reads_disp(path), (
        f"{module} reads a dispatcher's _disp: use the Pool's methods (see DISP_OWNERS)"
    )


@pytest.mark.parametrize(
    "text",
    [
        "import pickle\n",
        "import cloudpickle as cp\n",
        "from pickle import dumps\n",
        "def f():\n    from joblib.externals import cloudpickle\n",
        "from joblib.externals.cloudpickle import dumps\n",
    ],
)
def test_a_shipper_that_pickles_is_caught(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sample.py"
    path.write_text(text)
    with pytest.raises(AssertionError):
        test_only_the_codec_ships_a_call(path, "fastpool.mp")


@pytest.mark.parametrize(
    "text", ["def f(pool):\n    return pool._disp.closed\n", "x = getattr(p, '_disp', None)\n"]
)
def test_a_disp_reader_is_caught(tmp_path: Path, text: str) -> None:
    path = tmp_path / "_joblib_pools.py"
    path.write_text(text)
    with pytest.raises(AssertionError):
        test_nothing_outside_the_runtime_reads_disp(path, "fastpool._integrations._joblib_pools")
