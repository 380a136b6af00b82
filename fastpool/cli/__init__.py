"""``python -m fastpool [--version] {demo,bench,doctor}``.

    demo.py     a NumPy job on fastpool and multiprocessing.Pool, then supervision, live
    bench.py    standard scenarios against the installed peers; --user for your function
    doctor.py   what limits a pool on this machine; --smoke starts one

Each command module has ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when its command runs, so ``--version`` and ``--help`` stay quick.
Exit codes: 0 success, 1 a check or benchmark failed (or something blocks
fastpool), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = {
    "demo": "run a NumPy job on fastpool and multiprocessing.Pool side by side: per-task "
    "overhead, a 256 MiB array job, then a crash, a timeout and a memory kill (about 10 s)",
    "bench": "benchmark fastpool against the installed peers (multiprocessing.Pool, "
    "ProcessPoolExecutor, loky, joblib), or time your own function with --user",
    "doctor": "show what limits a pool here (CPUs, BLAS threads, memory, kernel features); "
    "paste it into a bug report; --smoke starts a pool",
}
# Commands that run without the compiled core: doctor reports its absence as a finding.
WITHOUT_CORE = {"doctor"}
# Set (unless the user did) before a command's module loads NumPy: the demo compares
# pools, not BLAS set-ups, with one BLAS thread per process and identical bits.
ENVIRONMENT = {
    "demo": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
}


def shadowed() -> str | None:
    """Why ``fastpool`` is not this package, or None: a folder named fastpool (a clone,
    say) on sys.path before the installed package, with no ``__init__.py``, imports as an
    empty namespace package; an editable install's finder then still serves this CLI."""
    import fastpool

    if getattr(fastpool, "__file__", None) is not None:
        return None
    where = ", ".join(getattr(fastpool, "__path__", ())) or "a namespace package"
    return (
        f"the name 'fastpool' resolves to {where}, a folder without __init__.py that "
        "shadows the installed fastpool (it imports as an empty namespace package, so "
        "fastpool.Pool does not exist). Run from another directory, or rename that folder"
    )


def _version() -> str:
    import platform

    import fastpool

    core = "compiled core present" if fastpool.CORE_ERROR is None else "compiled core MISSING"
    return f"fastpool {fastpool.__version__} ({core}; Python {platform.python_version()})"


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only ``command``'s module is imported to add its options
    (doctor counts this process's threads before anything imports NumPy)."""
    top = argparse.ArgumentParser(
        prog="python -m fastpool",
        description="fastpool: a supervised, zero-copy process pool for NumPy batch work.",
    )
    top.add_argument("--version", action="store_true", help="print the version and exit")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in COMMANDS.items():
        cmd = sub.add_parser(name, help=text, description=text)
        if name == command:
            importlib.import_module(f"fastpool.cli.{name}").add_arguments(cmd)
    return top


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    problem = shadowed()
    if problem is not None:
        print(f"python -m fastpool: {problem}", file=sys.stderr)
        return 1
    if args_list[:1] == ["--version"]:  # without building every subparser
        print(_version())
        return 0
    command = next((a for a in args_list if not a.startswith("-")), None)
    for var, value in ENVIRONMENT.get(command or "", {}).items():
        os.environ.setdefault(var, value)
    top = parser(command if command in COMMANDS else None)
    args = top.parse_args(args_list)
    if args.version:
        print(_version())
        return 0
    if args.command is None:
        top.print_help()
        return 2
    import fastpool

    if fastpool.CORE_ERROR is not None and args.command not in WITHOUT_CORE:
        print(f"python -m fastpool {args.command}: {fastpool.CORE_ERROR}", file=sys.stderr)
        return 1
    module = importlib.import_module(f"fastpool.cli.{args.command}")
    try:
        return int(module.run(args, top))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter flushes it at exit
        return 1
