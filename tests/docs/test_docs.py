"""The docs cannot rot: every Python example in README.md and docs/*.md runs, and every
relative link resolves.

- Each ```python block runs as a script of its own in a fresh interpreter, with the
  checkout first on PYTHONPATH and an empty temporary directory as its working directory,
  and must exit 0 within EXAMPLE_TIMEOUT_S. A block that is deliberately a fragment, or that
  needs what a test run does not have (a Dask cluster, a notebook), is preceded by the line
  ``<!-- docs-test: skip (why) -->``; it is reported as skipped with that reason. Any other
  ``docs-test:`` comment is an error, so a misspelt marker cannot hide an example. An
  example that fails only because an optional package (OPTIONAL) is not installed here is
  skipped and says which.
- Every relative link ``[text](path#anchor)`` must name a file or folder that exists, and
  an anchor must be a heading of the target page, slugged the way GitHub slugs headings.
  Pages in docs/ link only inside docs/, which is all MkDocs builds.
- mkdocs.yml's nav lists every page in docs/ and only pages that exist.

Examples run two at a time on threads (each in its own process), so the module costs about
half the sum of its examples.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_TIMEOUT_S = 90
PARALLEL = 2
# An example that fails only because one of these is not installed is skipped, saying so.
OPTIONAL = {
    "distributed",
    "dask",
    "tqdm",
    "rich",
    "matplotlib",
    "joblib",
    "sklearn",
    "scipy",
    "emcee",
}

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*docs-test:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s*\((.+)\)\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s[^>]*(?:id|name)=\"([^\"]+)\"")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None  # the reason, for a block marked skip

    @property
    def id(self) -> str:
        return f"{rel(self.page)}:{self.line}"


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for the lines outside fenced code."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.lstrip())
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
        else:
            yield n, line


def _prose(text: str) -> Iterator[tuple[int, str]]:
    """Lines outside fenced code, inline code spans blanked out (their brackets are no links)."""
    for n, line in _outside_fences(text):
        yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line)


def python_blocks(page: Path) -> list[Block]:
    """Every ```python block of ``page``, with the skip marker just above it, if any.

    Raises ValueError for a docs-test comment that is not ``skip (reason)`` or that no
    python block follows, so a typo cannot silently skip or run an example."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    pending: tuple[int, str] | None = None
    while i < len(lines):
        stripped = lines[i].strip()
        marker = MARKER.match(stripped)
        if marker:
            skip = SKIP.match(marker.group(1))
            if not skip:
                raise ValueError(
                    f"{rel(page)}:{i + 1}: a docs-test comment must read "
                    f"'<!-- docs-test: skip (why) -->', not {stripped!r}"
                )
            pending = (i + 1, skip.group(1).strip())
            i += 1
            continue
        m = FENCE.match(stripped)
        if m:
            fence, lang, start = m.group(1), m.group(2).lower(), i
            i += 1
            body = []
            while i < len(lines) and not (
                lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""
            ):
                body.append(lines[i])
                i += 1
            if lang in ("python", "py"):
                blocks.append(
                    Block(page, start + 1, "\n".join(body) + "\n", pending[1] if pending else None)
                )
            elif pending:
                raise ValueError(
                    f"{rel(page)}:{pending[0]}: the skip marker is followed by a "
                    f"{lang or 'plain'} block, not a python one"
                )
            pending = None
        elif stripped and pending:
            raise ValueError(
                f"{rel(page)}:{pending[0]}: the skip marker must sit just above a ```python fence"
            )
        i += 1
    return blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lowercased, characters other than
    letters, digits, ``_``, ``-`` and spaces dropped, spaces turned into ``-``."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a link may name in ``page``: its headings' slugs (a repeated slug gets
    ``-1``, ``-2``, ... as on GitHub) and the ids of its ``<a id=...>`` tags."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _outside_fences(page.read_text(encoding="utf-8")):
        found.update(HTML_ID.findall(line))
        h = HEADING.match(line)
        if h:
            slug = github_slug(h.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    """One message per relative link of ``page`` that does not resolve."""
    problems = []
    docs = ROOT / "docs"
    for n, line in _prose(page.read_text(encoding="utf-8")):
        targets = LINK.findall(line)
        ref = REF_DEF.match(line)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            where = f"{rel(page)}:{n}: [{target}]"
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{where}: {path_part} does not exist")
                continue
            if page.parent == docs and docs not in (dest, *dest.parents):
                problems.append(
                    f"{where}: leaves docs/, which is all MkDocs builds (write "
                    "the path in backticks, or link the repository's URL)"
                )
            if anchor:
                if dest.suffix != ".md":
                    problems.append(f"{where}: an anchor into {dest.name}, which is not Markdown")
                elif anchor not in anchors(dest):
                    problems.append(
                        f"{where}: {rel(dest)} has no heading with the anchor #{anchor}"
                    )
    return problems


BLOCKS = [b for page in PAGES for b in python_blocks(page)]
Done = subprocess.CompletedProcess[str]


def _run(block: Block) -> Done:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONSAFEPATH", None)
    with tempfile.TemporaryDirectory(prefix="docs-example-") as cwd:
        script = Path(cwd) / "example.py"
        script.write_text(block.code, encoding="utf-8")
        try:
            return subprocess.run(
                [sys.executable, str(script)],
                cwd=cwd,
                env=env,
                text=True,
                capture_output=True,
                timeout=EXAMPLE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return subprocess.CompletedProcess(
                exc.cmd, -9, out, err + f"\n(timed out after {EXAMPLE_TIMEOUT_S} s)"
            )


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Done]]]:
    """Starts every selected, unskipped example at once, PARALLEL at a time."""
    chosen = {
        item.callspec.params["block"].id
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_example_runs" and hasattr(item, "callspec")
    }
    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="docs-example") as pool:
        futures = {b.id: pool.submit(_run, b) for b in BLOCKS if b.id in chosen and not b.skip}
        yield futures
        for f in futures.values():
            f.cancel()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_runs(block: Block, runs: dict[str, Future[Done]]) -> None:
    if block.skip:
        pytest.skip(f"marked in {block.id}: {block.skip}")
    done = runs[block.id].result()
    missing = re.search(r"No module named '(\w+)", done.stderr) if done.returncode else None
    name = missing.group(1) if missing else ""
    if name in OPTIONAL and importlib.util.find_spec(name) is None:
        pytest.skip(f"{block.id} needs {name}, which is not installed here")
    assert done.returncode == 0, (
        f"the example at {block.id} exited {done.returncode}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )


@pytest.mark.parametrize("page", PAGES, ids=[rel(p) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_most_examples_run_and_every_skip_says_why() -> None:
    skipped = [b for b in BLOCKS if b.skip]
    assert len(BLOCKS) >= 10 and len(skipped) <= len(BLOCKS) // 4, [b.id for b in skipped]
    assert all(len(b.skip or "") >= 10 for b in skipped)  # a reason, not a placeholder


def test_the_mkdocs_nav_lists_every_page() -> None:
    nav = set(re.findall(r"[\w./-]+\.md\b", (ROOT / "mkdocs.yml").read_text(encoding="utf-8")))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert nav == pages, f"only in the nav: {sorted(nav - pages)}; not in it: {sorted(pages - nav)}"


def test_the_readme_starts_with_the_two_fresh_machine_commands() -> None:
    """The README's first commands are the install-and-demo and the test suite; .ci/run runs
    the second's test command verbatim."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^```sh\n(.*?)\n```", text, flags=re.MULTILINE | re.DOTALL)
    venv = "python -m venv .venv && . .venv/bin/activate && "
    assert commands[:2] == [
        venv + "pip install -e . && python -m fastpool demo",
        venv + "pip install -e '.[test]' && python -m pytest tests -q",
    ]
    assert "\npython -m pytest tests -q 2>&1" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250  # a front page: the rest lives in docs/


def test_the_api_table_names_every_pool_argument() -> None:
    """docs/api.md's argument table left out ``arena_bytes`` (issue 32)."""
    import inspect

    import fastpool

    table = (ROOT / "docs" / "api.md").read_text().split("## Methods")[0]
    named = set(re.findall(r"`(\w+)`", "".join(re.findall(r"^\| ([^|]+)\|", table, re.M))))
    params = set(inspect.signature(fastpool.Pool.__init__).parameters) - {"self"}
    in_prose = {"max_workers"}  # the workers row names it, as ProcessPoolExecutor's name
    assert params - named - in_prose == set()
    assert "max_workers" in table
