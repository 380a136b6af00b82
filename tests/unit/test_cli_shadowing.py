"""A folder named fastpool/ (a clone) beside the working directory shadows the installed
package as an empty namespace package; with an editable install the CLI still loads through
the install's finder. ``--version`` and ``doctor`` must report the shadowing, not crash
with AttributeError 'CORE_ERROR' (issue 15, section 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastpool

CLI = Path(fastpool.__file__).parent / "cli" / "__init__.py"

# What an editable install's finder does: `fastpool` is the namespace package found first
# on sys.path, `fastpool.cli` comes from the real tree.
SCRIPT = """
import importlib.util, sys
sys.path.insert(0, {shadow!r})
import fastpool
if getattr(fastpool, "__file__", None) is not None:
    sys.exit(77)  # a regular install on sys.path wins over the folder: nothing shadows
spec = importlib.util.spec_from_file_location("fastpool.cli", {cli!r})
cli = importlib.util.module_from_spec(spec)
sys.modules["fastpool.cli"] = cli
spec.loader.exec_module(cli)
sys.exit(cli.main({argv!r}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["doctor"]])
def test_a_shadowing_folder_is_reported_not_a_crash(tmp_path, argv):
    (tmp_path / "fastpool").mkdir()
    code = SCRIPT.format(shadow=str(tmp_path), cli=str(CLI), argv=argv)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=env,
    )
    if proc.returncode == 77:
        pytest.skip("fastpool is installed as a regular package here: a folder cannot shadow it")
    assert proc.returncode == 1, proc.stderr
    assert "AttributeError" not in proc.stderr
    assert str(tmp_path / "fastpool") in proc.stderr and "shadows the installed" in proc.stderr
