"""Claims of the C tests in tests/native, built against csrc and run from pytest.

Each tests/native/test_*.c is compiled twice into a temporary directory (never
into the repo): plain, and with AddressSanitizer + UBSan.  Every TEST(name) in
a file becomes its own pytest item, run as `binary name` in a fresh process, so
a failing claim is reported under its own name with the binary's stdout and
stderr.  The names come from a regex over the source at collection time (no
compiler needed to collect); test_every_c_test_is_collected checks the regex
against the binary's own --list.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_DIR = ROOT / "tests" / "native"
CSRC_DIR = ROOT / "csrc"

CFLAGS = [
    "-std=c11",
    "-O1",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-D_GNU_SOURCE",
    f"-I{CSRC_DIR}",
    "-pthread",
]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
BUILDS = {"plain": [], "asan": SANITIZE_FLAGS}
COMPILE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 120

# UBSan only prints by default and lets the program exit 0: make it fail the run.
SANITIZER_ENV = {
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    "ASAN_OPTIONS": "detect_leaks=1:strict_string_checks=1",
}

# Files whose claims rest on futex semantics or cross-process shared memory;
# the non-Linux fallback in fp_futex.h only sleeps briefly, so timing claims fail.
LINUX_SOURCES = {"test_futex.c", "test_board.c", "test_ring_procs.c", "test_arena.c"}

GCC = shutil.which("gcc")
TEST_RE = re.compile(r"^TEST\((\w+)\)", re.MULTILINE)


def _sources() -> list[Path]:
    return sorted(NATIVE_DIR.glob("test_*.c"))


def _marks(src: Path) -> list[pytest.MarkDecorator]:
    if src.name not in LINUX_SOURCES:
        return []
    return [
        pytest.mark.linux,
        pytest.mark.skipif(
            not sys.platform.startswith("linux"), reason="needs Linux futex and fork semantics"
        ),
    ]


def _cases() -> list[object]:
    cases = []
    for src in _sources():
        for name in TEST_RE.findall(src.read_text()):
            cases.append(pytest.param(src, name, id=f"{src.stem}.{name}", marks=_marks(src)))
    return cases


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)


def _describe(proc: subprocess.CompletedProcess[str], what: str) -> str:
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    return f"{what}: {how}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


@pytest.fixture(scope="session")
def sanitizers_link(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    """None if gcc can build and run an ASan+UBSan program here, else why not."""
    if GCC is None:
        return "gcc not found"
    d = tmp_path_factory.mktemp("sanitizer_probe")
    (d / "probe.c").write_text("int main(void) { return 0; }\n")
    try:
        build = subprocess.run(
            [GCC, *SANITIZE_FLAGS, str(d / "probe.c"), "-o", str(d / "probe")],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if build.returncode != 0:
            return f"gcc cannot link -fsanitize=address,undefined: {build.stderr.strip()[:500]}"
        run = _run([str(d / "probe")], env={**os.environ, **SANITIZER_ENV})
        if run.returncode != 0:
            return f"a sanitized program does not run here: {run.stderr.strip()[:500]}"
    except subprocess.TimeoutExpired:
        return "the sanitizer probe timed out"
    return None


@pytest.fixture(scope="session")
def native_binary(
    tmp_path_factory: pytest.TempPathFactory, sanitizers_link: str | None
) -> Callable[[Path, str], Path]:
    """build(src, kind) -> the compiled binary, built once per session and kind.

    A compile error fails every test of that file with gcc's output."""
    out_dir = tmp_path_factory.mktemp("native")
    built: dict[tuple[Path, str], Path | str] = {}

    def build(src: Path, kind: str) -> Path:
        if GCC is None:
            pytest.skip("gcc not found on PATH: the C tests need a C compiler")
        if kind == "asan" and sanitizers_link is not None:
            pytest.skip(f"sanitizer build skipped: {sanitizers_link}")
        key = (src, kind)
        if key not in built:
            exe = out_dir / f"{src.stem}-{kind}"
            proc = subprocess.run(
                [GCC, *CFLAGS, *BUILDS[kind], str(src), "-o", str(exe)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
            )
            built[key] = (
                exe if proc.returncode == 0 else _describe(proc, f"gcc ({kind}) {src.name}")
            )
        result = built[key]
        if isinstance(result, str):
            pytest.fail(result, pytrace=False)
        return result

    return build


@pytest.mark.parametrize("kind", list(BUILDS))
@pytest.mark.parametrize(("src", "name"), _cases())
def test_c(native_binary: Callable[[Path, str], Path], src: Path, name: str, kind: str) -> None:
    exe = native_binary(src, kind)
    env = {**os.environ, **SANITIZER_ENV} if kind == "asan" else None
    try:
        proc = _run([str(exe), name], env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{src.name}:{name} ({kind}) ran past {RUN_TIMEOUT_S} s\n"
            f"--- stdout ---\n{exc.stdout}\n--- stderr ---\n{exc.stderr}",
            pytrace=False,
        )
    if proc.returncode != 0 or "runtime error:" in proc.stderr:
        pytest.fail(_describe(proc, f"{src.name}:{name} ({kind})"), pytrace=False)


@pytest.mark.parametrize("src", [pytest.param(s, id=s.stem) for s in _sources()])
def test_every_c_test_is_collected(native_binary: Callable[[Path, str], Path], src: Path) -> None:
    proc = _run([str(native_binary(src, "plain")), "--list"])
    assert proc.returncode == 0, _describe(proc, f"{src.name} --list")
    assert proc.stdout.split() == TEST_RE.findall(src.read_text())


def test_native_sources_exist() -> None:
    assert {s.name for s in _sources()} >= {
        "test_ring.c",
        "test_board.c",
        "test_ring_procs.c",
        "test_futex.c",
        "test_arena.c",
    }
