"""Tiny random-init models of the three supported architectures, built in the tests."""

from __future__ import annotations

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, OlmoConfig, OlmoeConfig, OlmoeForCausalLM, OlmoForCausalLM

VOCAB = 512
CONTEXT = 256


def tiny_config(arch: str, vocab_size: int = VOCAB):
    common = dict(vocab_size=vocab_size, bos_token_id=None, eos_token_id=None, pad_token_id=None, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=CONTEXT)
    if arch == "gpt_neox":
        return GPTNeoXConfig(**common, rotary_pct=0.25)
    if arch == "olmo":
        return OlmoConfig(**common, clip_qkv=0.5)  # small enough that the clip really bites
    if arch == "olmoe":
        return OlmoeConfig(**common, num_experts=4, num_experts_per_tok=2, clip_qkv=0.5)
    raise ValueError(arch)


MODEL_CLASSES = {"gpt_neox": GPTNeoXForCausalLM, "olmo": OlmoForCausalLM, "olmoe": OlmoeForCausalLM}
ARCHS = tuple(MODEL_CLASSES)


def tiny_model(arch: str, seed: int = 0, attn_implementation: str = "eager", vocab_size: int = VOCAB):
    torch.manual_seed(seed)
    config = tiny_config(arch, vocab_size)
    config._attn_implementation = attn_implementation
    model = MODEL_CLASSES[arch](config).eval()
    with torch.no_grad():  # sharpen attention so patterns are not near-uniform
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(3.0)
    return model


def save_tiny_model(arch: str, path, seed: int = 0, vocab_size: int = VOCAB) -> None:
    tiny_model(arch, seed, vocab_size=vocab_size).save_pretrained(path, safe_serialization=True)
