"""CPython 3.13's own ``multiprocessing`` pool tests against ``fastpool.mp.Pool``: a peer suite.

Runs tests/compat/cpython_mp.py (``_TestPool``, ``_TestPoolWorkerErrors``,
``_TestPoolWorkerLifetime``, ``TestInitializers`` and the start method's
``test_multiprocessing_main_handling`` class, from the interpreter's own ``test`` package) under
fork, spawn and forkserver, against ``fastpool.mp.Pool`` and against ``multiprocessing.Pool``
as the control, in the CPython 3.13 virtualenv that test_cpython_futures.py builds for this
checkout. Every fastpool test must pass, be skipped for reading ``multiprocessing.pool.Pool``
internals, or fail as listed in the adapter's EXPECTED_FAILURES (mirrored in
docs/multiprocessing.md); every control test must pass. The two pools of one start method run
at once: about 90 s on 2 cores with a warm virtualenv (a first build adds about a minute).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from compat.test_cpython_futures import cpython_venv

ADAPTER = Path(__file__).with_name("cpython_mp.py")
START_METHODS = ("fork", "spawn", "forkserver")

pytestmark = [pytest.mark.peer_suite, pytest.mark.timeout(1200)]


def test_cpython_multiprocessing_pool_tests_pass_or_fail_as_listed(tmp_path: Path) -> None:
    exe, env = cpython_venv()
    reports: dict[str, dict] = {}
    for method in START_METHODS:
        procs = {}
        for pool in ("fastpool", "multiprocessing"):
            out = tmp_path / f"{method}-{pool}.json"
            log = open(tmp_path / f"{method}-{pool}.log", "w")
            cmd = [exe, str(ADAPTER), f"--start-method={method}", f"--pool={pool}", "--json"]
            # cwd: not the checkout, whose fastpool/ would shadow the installed one
            procs[pool] = (
                subprocess.Popen([*cmd, str(out)], cwd=tmp_path, env=env, stderr=log, stdout=log),
                out,
                log,
            )
        for pool, (proc, out, log) in procs.items():
            proc.wait(timeout=600)
            log.close()
            tail = (tmp_path / f"{method}-{pool}.log").read_text()[-4000:]
            assert out.exists(), tail
            reports[f"{method}/{pool}"] = json.loads(out.read_text())
    failures = []
    for name, report in reports.items():
        print(name, json.dumps(report["counts"]), file=sys.stderr)
        for key, (outcome, detail) in report["outcomes"].items():
            if outcome not in ("passed", "skipped", "expected failure"):
                failures.append(f"{name} {key}: {outcome}\n{detail}")
        if name.endswith("/multiprocessing"):  # the control: every test runs and passes
            assert report["counts"]["passed"] == len(report["outcomes"]), name
        assert report["counts"]["passed"] >= 35, name  # the suite really ran
    assert not failures, "\n\n".join(failures)
