"""The suite's sharing holds under ``--dist loadgroup`` (``tests/conftest.py``): the trained toy panel is
made once for the session whichever workers read it (``tests/helpers/shared.py``), the test that
trains it runs on one worker with the module that marks itself ``xdist_group("toy_panel")`` (the
SLURM tests), and the tests that read it run after those that do not. Run on a small suite of its
own, with this suite's collection hook and the real ``made_once``."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import time
import pytest
from tests.conftest import pytest_collection_modifyitems  # the hook under test
from tests.helpers.shared import made_once

def train(folder):
    time.sleep(2)  # long enough that the other worker asks while it is being made
    with open(folder.parent / "makes.log", "a") as log:
        log.write("made\\n")
    (folder / "weights").write_text("w")

@pytest.fixture(scope="session")
def toy_panel(tmp_path_factory):
    return made_once(tmp_path_factory, "toy_panel", train)
"""
BY_FIXTURE = """
import pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass

@pytest.mark.parametrize("i", range(3))
def test_with_the_panel(toy_panel, i):
    assert (toy_panel / "weights").read_text() == "w"
"""
BY_MODULE_MARK = """
import pytest

pytestmark = pytest.mark.xdist_group("toy_panel")

def test_marked(toy_panel):
    assert (toy_panel / "weights").read_text() == "w"

def test_marked_without_the_fixture():
    pass
"""


@pytest.mark.slow
def test_the_toy_panel_is_made_once_and_its_trainer_shares_a_worker_with_the_slurm_group(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_by_fixture.py").write_text(BY_FIXTURE)
    (tmp_path / "test_by_module_mark.py").write_text(BY_MODULE_MARK)
    base = tmp_path / "base"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--basetemp={base}",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (base / "makes.log").read_text() == "made\n"  # once, for both workers
    # xdist's verbose lines: "[gw0] [ 10%] PASSED test_by_fixture.py::test_with_the_panel[0]..."
    passed = re.findall(r"\[(gw\d+)\].*PASSED \S*::(test_\w+(?:\[\d\])?)", done.stdout)
    assert len(passed) == 11, done.stdout[-3000:]
    worker = dict((name, gw) for gw, name in passed)
    trainer = "test_with_the_panel[0]"  # the first test that reads the panel
    assert worker[trainer] == worker["test_marked"] == worker["test_marked_without_the_fixture"]
    readers = [i for i, (_, name) in enumerate(passed) if "panel" in name and name != trainer]
    alone = [i for i, (_, name) in enumerate(passed) if name.startswith("test_alone")]
    assert min(readers) > min(alone)  # handed out after the tests that need no panel
