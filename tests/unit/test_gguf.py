"""``model.gguf_file`` before any weights load: the packages it needs, the file it names, a file that is
not GGUF or is cut short (the real file's tests are in tests/e2e/test_real_model.py)."""

import importlib.util

import pytest

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub import gguf
from emergence.run.validation import validate
from tests.helpers.tiny_models import save_tiny_gguf


def test_missing_packages_name_the_extra(monkeypatch):
    for missing, words in ((("accelerate",), "accelerate"), (("gguf", "accelerate"), "gguf and accelerate")):
        # a package is found where find_spec returns anything but None: the test needs neither installed
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a, missing=missing: None if name in missing else object()
        )
        with pytest.raises(UsageError, match=rf"needs {words}; install them: pip install 'emergence\[gguf\]'"):
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
    pytest.importorskip("gguf", reason="needs the [gguf] extra: pip install -e '.[gguf]'")
    path = tmp_path / "m.gguf"
    path.write_text("not a model at all\n")
    with pytest.raises(
        UsageError,
        match=r"m.gguf is truncated or not a GGUF file \(GGUF magic invalid\); "
        "download it again",
    ):
        gguf.read_header(path)


def test_a_file_cut_anywhere_is_one_line(tmp_path):
    """Cut after its magic, inside its header, metadata, tensor infos or data, or by its last byte:
    every cut is one line naming the file and the fix; the whole file reads."""
    whole = tmp_path / "whole.gguf"
    save_tiny_gguf(whole)
    assert gguf.read_header(whole) == gguf.GgufHeader("whole.gguf", "llama", {"F16": 1, "F32": 2})
    data = whole.read_bytes()
    cut = tmp_path / "m.gguf"
    for size in [*range(4, 400), *range(400, len(data), 61), len(data) - 1]:
        cut.write_bytes(data[:size])
        with pytest.raises(UsageError) as refused:
            gguf.read_header(cut)
        line = str(refused.value)
        assert "\n" not in line, (size, line)
        expected = f"model.gguf_file='m.gguf' cannot be read: {cut} is truncated or not a GGUF file ("
        assert line.startswith(expected), line
        assert line.endswith("); download it again"), (size, line)
