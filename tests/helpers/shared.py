"""What the whole test session makes once and every pytest-xdist worker reads: a trained toy panel, a
dequantized real model. The first worker to ask makes it under a file lock; the others wait for it
and read the same folder, so the tests that read it may run on any worker."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE = ".done"  # written last: a folder without it was left by a maker that failed


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder every worker sees: under xdist each worker's base temp is a subfolder of
    the session's own (``pytest-N/popen-gwK``); without xdist the base temp is the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``<session root>/<name>``, made by ``make(folder)`` by the first worker to ask for it. A maker
    that failed leaves no ``.done``: the next worker to ask makes it again from an empty folder rather
    than read half of one, and fails or succeeds on its own."""
    root = session_root(tmp_path_factory)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / DONE).touch()
    return folder
