"""The repository speaks for itself: no file of it cites a file that is not in it.

The protocols are in docs/method.md and docs/tasks.md (and the Hub's layouts in docs/hub.md and
docs/architectures.md); a citation of the notes they were written from, which are not in the
repository, cannot be followed by its reader. Two forms of citation are checked: a path that
climbs (``../x``), which must land on a file of the repository from the citing file's folder, and
an upper-case note's name (``NOTES.md``), which must be a file of the repository.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIMBING = re.compile(r"(?<![\w/.-])((?:\.\./)+[\w./-]*\w)")
NOTE = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]*\.md)\b")
SKIPPED_DIRS = {
    ".git",
    "build",
    "outputs",
    "wandb",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".import_linter_cache",
}


def _repository_files() -> list[Path]:
    """The tracked files (``git ls-files``); outside a git checkout, every file under the root but
    build outputs and caches."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)]
    return [ROOT / name for name in listed.decode().split("\0") if name]


def _citations(text: str, folder: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line number, line) of each line of ``text``, a file in ``folder``, citing a file that is not
    in the repository (``names``: the repository's file names)."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        climbs = [(folder / path).resolve() for path in CLIMBING.findall(line)]
        outside = any(not target.is_relative_to(ROOT) or not target.exists() for target in climbs)
        if outside or any(note not in names for note in NOTE.findall(line)):
            found.append((n, line.strip()))
    return found


def outside_citations(files: list[Path]) -> list[str]:
    """'path:line: text' for every line of a text file that cites a file outside the repository."""
    names = {path.name for path in files}
    found = []
    for path in files:
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (figures)
            continue
        text = data.decode("utf-8", "replace")
        found += [f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in _citations(text, path.parent, names)]
    return found


def test_no_file_cites_a_file_outside_the_repository():
    files = _repository_files()
    assert len(files) > 100  # the listing found the repository
    assert outside_citations(files) == []


def test_the_check_finds_a_citation():
    docs, names = ROOT / "docs", {"README.md", "hub.md", "method.md"}
    for text in (
        '"""The study\'s batches (NOTES.md 1.1)."""',
        "see PROTOCOL.md section 3",
        "../elsewhere/NOTES.md",
        "[the layouts](../../outside/layouts.md)",
        "[a file no longer here](../emergence/gone.py)",
    ):
        assert _citations(text, docs, names) == [(1, text)], text
    for text in (
        "docs/hub.md",
        "[hub.md](hub.md)",
        "README.md",
        "[the layout](../emergence/recipe/head_weights.py)",
        "docs/tasks.md, The batches",
        "docs/method.md section 3",
        "report.md",
    ):
        assert _citations(text, docs, names) == [], text


def test_every_package_installs():
    """pyproject's package list names every package folder: a wheel (``pip install .``) holds only
    those, so one left out imports from a checkout and fails everywhere else."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("emergence", "hydra_plugins")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set()


SHAPE = re.compile(r'\b(?:Float|Int|Bool|Shaped)\[[\w.]+, "([^"]+)"\]')


def test_every_dimension_a_record_names_is_in_the_glossary():
    """The jaxtyping shapes of the records name their dimensions from docs/glossary.md's table (a
    number is its own name; ``T-1`` is ``T``'s)."""
    glossary = set(re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs" / "glossary.md").read_text(), re.MULTILINE))
    named = {
        dim: path.relative_to(ROOT)
        for path in (ROOT / "emergence").rglob("*.py")
        for shape in SHAPE.findall(path.read_text())
        for dim in re.split(r"[\s\-+*/]+", shape.strip())
        if dim and not dim.isdigit()
    }
    assert len(named) > 10  # the pattern finds the annotations
    assert {dim: str(path) for dim, path in named.items() if dim not in glossary} == {}
