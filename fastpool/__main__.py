"""``python -m fastpool demo``: see fastpool/_demo.py.  Without a command, prints usage."""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastpool",
        description="fastpool: a supervised process pool for NumPy batch work.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run a NumPy batch job on fastpool and on multiprocessing.Pool, then crash, "
        "segfault and time out workers on purpose (under 10 s)",
        description="Runs a NumPy batch job on built-in data with fastpool.Pool and with "
        "multiprocessing.Pool (same worker count), prints both throughputs and checks the "
        "results are identical; then shows supervision: tasks that SIGKILL or segfault their "
        "worker, and a per-task timeout. Exits 0 when every check passed, 1 otherwise.",
    )
    demo.add_argument("--workers", type=int, default=None,
                      help="worker processes for both pools (default: the CPUs this process may use)")
    demo.add_argument("--batches", type=int, default=64, help="number of batches (default: 64)")
    demo.add_argument("--rounds", type=int, default=3,
                      help="timed rounds per pool; the best one counts (default: 3)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        if args.workers is not None and args.workers < 1:
            parser.error("--workers must be at least 1")
        if args.batches < 8 or args.rounds < 1:
            parser.error("--batches must be at least 8 and --rounds at least 1")
        # Before numpy is imported (fastpool itself does not import it): one BLAS
        # thread per process, unless the user chose otherwise (see _demo.BLAS_ENV_VARS).
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        from fastpool import _demo

        return _demo.run_demo(args.workers, args.batches, args.rounds)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
