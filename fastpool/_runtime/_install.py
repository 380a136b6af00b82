"""Why ``fastpool._native._core`` did not import, in words a user can act on.
Standard library only.

The usual cause is shadowing: after a plain ``pip install .`` the compiled core lives
in site-packages, but Python puts the current directory (``python -m``, ``-c``, the
REPL) or a script's own directory first on ``sys.path``, so a run from the source
checkout imports the checkout's ``fastpool/``, which has no ``_core*.so``.  Less often
the install itself is broken, or built for another Python.  An installed copy is looked
for on ``sys.path`` and behind import hooks: setuptools' editable install of this flat
layout is a finder after the path scan, with no ``sys.path`` entry.

``__init__.py`` raises ImportError with ``core_missing_message``, except under
``python -m fastpool``, where the CLI reports the same text (``doctor`` as one of
its findings) instead of a traceback: ``launched_as_cli`` tells the two apart.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["core_missing_message", "installed_copies", "is_source_checkout", "launched_as_cli"]

_ARG_OPTIONS = "WXQ"  # python's one-letter options that take a value (-c and -m end the options)


def launched_as_cli(
    argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None
) -> bool:
    """True while ``python [options] -m fastpool ...`` imports the package, before its
    __main__ runs.

    runpy sets ``sys.argv[0]`` to ``"-m"`` while it imports the package, and the
    interpreter's own command line (``sys.orig_argv``) names the module: both must
    agree, so ``python -m otherpkg`` importing fastpool still gets the ImportError."""
    argv = sys.argv if argv is None else argv
    orig = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    if list(argv[:1]) != ["-m"]:
        return False
    args = iter(orig[1:])
    for arg in args:
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return False  # a script, stdin, or the end of the options: not -m
        if arg.startswith("--"):
            continue  # --check-hash-based-pycs and friends take their value after "="
        for i, letter in enumerate(arg[1:], 1):
            if letter in "mc":
                value = arg[i + 1 :] or next(args, "")
                return letter == "m" and value == "fastpool"
            if letter in _ARG_OPTIONS:
                if not arg[i + 1 :]:
                    next(args, None)  # the value is the next argument
                break
    return False


def is_source_checkout(pkg_dir: Path) -> bool:
    """True when ``pkg_dir`` (a ``fastpool/`` directory) sits in a source tree, beside
    setup.py and csrc/."""
    root = pkg_dir.parent
    return (root / "setup.py").is_file() and (root / "csrc").is_dir()


def _core_files(pkg_dir: Path) -> list[Path]:
    return sorted(p for p in (pkg_dir / "_native").glob("_core*") if p.suffix in (".so", ".pyd"))


def _specs(
    path: Sequence[str] | None, meta_path: Sequence[object] | None
) -> Iterator[importlib.machinery.ModuleSpec]:
    """Each regular package named fastpool that the import system could load, in its
    order: those on ``path`` (default ``sys.path``), then those an import hook serves
    (``meta_path``, default ``sys.meta_path``: setuptools' editable install of a flat
    layout puts no entry on sys.path, only a finder after the path scan)."""
    for entry in sys.path if path is None else path:
        spec = importlib.machinery.PathFinder.find_spec("fastpool", [entry])
        if spec is not None and spec.origin:  # not a namespace portion
            yield spec
    for finder in sys.meta_path if meta_path is None else meta_path:
        find = getattr(finder, "find_spec", None)
        if finder is importlib.machinery.PathFinder or find is None:
            continue
        try:
            spec = find("fastpool", None)
        except Exception:  # noqa: BLE001 - someone else's hook: its failure is not ours to report
            continue
        if spec is not None and spec.origin:
            yield spec


def installed_copies(
    pkg_dir: Path, path: Sequence[str] | None = None, meta_path: Sequence[object] | None = None
) -> list[Path]:
    """Other ``fastpool/`` directories that hold a compiled core: on ``path`` (default
    ``sys.path``) or served by an import hook (``meta_path``, default ``sys.meta_path``)."""
    here = pkg_dir.resolve()
    found: list[Path] = []
    for spec in _specs(path, meta_path):
        candidate = Path(str(spec.origin)).resolve().parent
        if candidate != here and candidate not in found and _core_files(candidate):
            found.append(candidate)
    return found


def core_missing_message(
    exc: BaseException,
    pkg_dir: Path | None = None,
    path: Sequence[str] | None = None,
    meta_path: Sequence[object] | None = None,
) -> str:
    """What happened and what to do, for an ImportError of ``fastpool._native._core``;
    ``path`` and ``meta_path`` are where installed copies are looked for (installed_copies)."""
    pkg_dir = Path(__file__).resolve().parent.parent if pkg_dir is None else pkg_dir
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built = _core_files(pkg_dir)
    if built:
        # The file is there and did not load: a build for another Python or NumPy, or
        # a library it links against is missing.  The loader's words say which.
        return (
            f"fastpool's compiled core in {pkg_dir} failed to load ({exc}). It was probably built "
            f"for another Python or NumPy than this one (Python {sys.version.split()[0]}, expects "
            f"_core{suffix}). Rebuild it: `pip install --force-reinstall --no-cache-dir .` "
            "from the source tree, or `pip install -e .` in a checkout."
        )
    if is_source_checkout(pkg_dir):
        root = pkg_dir.parent
        others = installed_copies(pkg_dir, path, meta_path)
        first = (
            "Python put the current directory first on sys.path (as it does for `python -m`, "
            "`python -c` and the REPL; for a script, the script's own directory)"
        )
        if others:
            return (
                f"fastpool was imported from the source checkout {root}, which has no compiled "
                f"core (_core{suffix}), instead of the installed copy in {others[0]}: {first}, so "
                "the checkout's fastpool/ shadows the installed package. Do one of: install the "
                f"checkout in development mode (`pip install -e .` in {root}: the core is built "
                "into the checkout and every way of running works); run from another directory; "
                "or set PYTHONSAFEPATH=1 (Python 3.11+), which keeps the current directory off "
                "sys.path. "
                f"(Python said: {exc})"
            )
        return (
            f"fastpool was imported from the source checkout {root}, which has no compiled core "
            f"(_core{suffix}), and no installed fastpool was found (on sys.path, or by an "
            "import hook such as an editable install's). Build it: "
            f"`pip install -e .` in {root} (a C compiler and Python headers are needed). "
            f"(Python said: {exc})"
        )
    return (
        f"fastpool's compiled core (_core{suffix}) is missing from {pkg_dir}: the install is "
        "incomplete, or was made for another Python. Reinstall with "
        "`pip install --force-reinstall --no-cache-dir fastpool` (from a source tree: "
        f"`pip install .`). (Python said: {exc})"
    )
