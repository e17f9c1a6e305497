"""The suite's groups hold under ``--dist loadgroup``: every test of the trained toy panel runs on the
worker that trains it (``tests/conftest.py``), whether the group comes from the fixture or from a
module's own mark. Run on a small suite of its own, with this suite's collection hook."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest
from tests.conftest import pytest_collection_modifyitems  # the hook under test

@pytest.fixture(scope="session")
def toy_panel():
    return None
"""
BY_FIXTURE = """
import pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass

@pytest.mark.parametrize("i", range(3))
def test_with_the_panel(toy_panel, i):
    pass
"""
BY_MODULE_MARK = """
import pytest

pytestmark = pytest.mark.xdist_group("toy_panel")

def test_marked(toy_panel):
    pass

def test_marked_without_the_fixture():
    pass
"""


@pytest.mark.slow
def test_the_toy_panels_tests_share_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_by_fixture.py").write_text(BY_FIXTURE)
    (tmp_path / "test_by_module_mark.py").write_text(BY_MODULE_MARK)
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
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # xdist's verbose lines: "[gw0] [ 10%] PASSED test_by_fixture.py::test_with_the_panel[0]..."
    workers = re.findall(r"\[(gw\d+)\].*PASSED \S*::test_(?:with_the_panel|marked)", done.stdout)
    assert len(workers) == 5, done.stdout[-3000:]
    assert len(set(workers)) == 1, f"the toy panel's tests ran on {sorted(set(workers))}"
