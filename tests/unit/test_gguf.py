"""``model.gguf_file`` before any weights load: the packages it needs, the file it names, a file that is
not GGUF or is cut short (the real file's tests are in tests/e2e/test_real_model.py)."""

import importlib.util

import pytest

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub import gguf
from emergence.run.validation import validate


def test_missing_packages_name_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(UsageError, match=r"needs accelerate; install them: pip install 'emergence\[gguf\]'"):
        gguf.check_installed("m.gguf")


def test_validation_refuses_a_file_that_is_not_gguf_by_name():
    cfg = compose_config(["model=local", "model.name_or_path=/tmp", "model.gguf_file=model.safetensors"])
    with pytest.raises(UsageError, match=r"model.gguf_file='model.safetensors' is invalid: name a .gguf file"):
        validate(cfg)


def test_a_missing_file_lists_the_folders_gguf_files(tmp_path):
    (tmp_path / "a.Q8_0.gguf").write_bytes(b"")
    with pytest.raises(UsageError, match=r"holds no such file \(its .gguf files: a.Q8_0.gguf\)"):
        gguf.gguf_path(str(tmp_path), "b.gguf", None, True)


def test_a_foreign_file_is_one_line(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_text("not a model at all\n")
    with pytest.raises(UsageError, match=r"m.gguf is truncated or not a GGUF file \(GGUF magic invalid\); "
                                         "download it again"):
        gguf.read_header(path)
