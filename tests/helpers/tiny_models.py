"""Tiny random-init models of every tested architecture, built in the tests.

Each exercises what makes its family different: grouped-query attention (2 KV heads for
4 query heads), sliding windows shorter than the test probe (T=64), q/k norms, OLMo's
clip_qkv, Gemma 2's logit soft-capping, query_pre_attn_scalar and head_dim != hidden/heads,
GPT-2's Conv1D projections, GPTNeoX's partial rotary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    OlmoConfig,
    OlmoeConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 512
CONTEXT = 256
WINDOW = 16  # sliding window, shorter than the test probe


def tiny_config(arch: str, vocab_size: int = VOCAB):
    common = dict(
        vocab_size=vocab_size,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=CONTEXT,
    )
    gqa = dict(common, num_key_value_heads=2)
    if arch == "gpt_neox":
        return GPTNeoXConfig(**common, rotary_pct=0.25)
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            bos_token_id=None,
            eos_token_id=None,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_inner=64,
            n_positions=CONTEXT,
        )
    if arch == "olmo":
        return OlmoConfig(**common, clip_qkv=0.5)  # small enough that the clip really bites
    if arch == "olmoe":
        return OlmoeConfig(**common, num_experts=4, num_experts_per_tok=2, clip_qkv=0.5)
    if arch == "olmo2":
        return Olmo2Config(**gqa)
    if arch == "llama":
        return LlamaConfig(**gqa)
    if arch == "mistral":
        return MistralConfig(**gqa, sliding_window=WINDOW)
    if arch == "qwen2":  # layer 1 slides, layer 0 does not
        return Qwen2Config(**gqa, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if arch == "qwen3":
        return Qwen3Config(**gqa, head_dim=16)
    if arch == "phi3":
        return Phi3Config(**gqa, sliding_window=WINDOW)
    if arch == "gemma2":  # alternating sliding / global layers; with a wider init, a cap of 2 clips many logits
        return Gemma2Config(
            **gqa,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=30.0,
            initializer_range=0.1,
        )
    raise ValueError(arch)


ARCHS = ("gpt_neox", "olmo", "olmoe", "olmo2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt2")


def tiny_model(arch: str, seed: int = 0, attn_implementation: str = "eager", vocab_size: int = VOCAB):
    torch.manual_seed(seed)
    config = tiny_config(arch, vocab_size)
    config._attn_implementation = attn_implementation
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()
    with torch.no_grad():  # sharpen attention so patterns are not near-uniform
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name and "wte" not in name and "wpe" not in name:
                p.mul_(3.0)
    return model


def save_tiny_model(arch: str, path, seed: int = 0, vocab_size: int = VOCAB) -> None:
    tiny_model(arch, seed, vocab_size=vocab_size).save_pretrained(path, safe_serialization=True)


def save_tiny_model_with_a_sink_head(path, layer: int = 0, head: int = 1, sharpness: float = 13.0) -> None:
    """The tiny GPT-2 with one hand-made sink: ``L{layer}H{head}``'s query is a constant and its key
    reads one residual direction that position 0's embedding is pushed far along, so every query
    gives key 0 all but ~1e-8 of that head's attention (at T=64, ``sharpness`` 13: a baseline of
    ~4e-8, whose null draws are the far tail of the softmax, as a sharp trained head's are)."""
    model = tiny_model("gpt2")
    n_embd, head_dim = model.config.n_embd, model.config.n_embd // model.config.n_head
    direction = torch.zeros(n_embd)
    direction[0] = 1.0
    with torch.no_grad():
        c_attn = model.transformer.h[layer].attn.c_attn  # Conv1D: x @ weight + bias, columns q | k | v
        q = slice(head * head_dim, (head + 1) * head_dim)
        k = slice(n_embd + head * head_dim, n_embd + (head + 1) * head_dim)
        c_attn.weight[:, q] = 0.0
        c_attn.bias[q] = sharpness / head_dim**0.5
        c_attn.weight[:, k] = torch.outer(direction, torch.ones(head_dim)) / head_dim**0.5
        c_attn.bias[k] = 0.0
        model.transformer.wpe.weight[0] += 50.0 * direction
    model.save_pretrained(path, safe_serialization=True)


def save_tiny_gguf(path) -> None:
    """A GGUF file as llama.cpp's writer lays it out: header, metadata, tensor infos, aligned data."""
    gguf_module = pytest.importorskip("gguf", reason="needs the [gguf] extra: pip install -e '.[gguf]'")
    writer = gguf_module.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(64)
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.full(64, layer + 1.0, dtype=np.float32))
    writer.add_tensor("token_embd.weight", np.arange(32 * 64, dtype=np.float16).reshape(32, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
