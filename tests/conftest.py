import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import ARCHS, save_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved (safetensors) tiny random model directory per architecture."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for arch in ARCHS:
        dirs[arch] = root / arch
        save_tiny_model(arch, dirs[arch])
    return dirs
