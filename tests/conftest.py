import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hub_server import hub_server  # noqa: E402,F401  (the fixture, for every test module)
from tiny_models import ARCHS, save_tiny_model  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Toy panels and cached measurements of the tests go to a temporary cache, not the user's."""
    os.environ["EMERGENCE_CACHE"] = str(tmp_path_factory.mktemp("emergence-cache"))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved (safetensors) tiny random model directory per architecture."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = root / arch
        save_tiny_model(arch, dirs[arch])
    return dirs
