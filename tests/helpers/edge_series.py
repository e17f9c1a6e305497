"""A hand-made checkpoint series for the edge's tests, and the edge computed independently of it.

``save_series`` saves a tiny model (tests/helpers/tiny_models.py) at steps 0, s, 2s, ...: each update
is a few fixed directions with changing, decaying weights plus a little noise, so a window's spectrum is
dominated by its signal, as a trained network's is (Xu 2026: sigma_W far above the noise floor).
``independent_ratios`` is the edge written a second way: each checkpoint's tensors read with
safetensors (not the loader), the scope's coordinates cut by hand, the updates stacked and their
singular values taken by an SVD in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from tests.helpers.tiny_models import tiny_model


def save_series(root: Path, arch: str = "gpt_neox", steps: list[int] | None = None, seed: int = 0) -> list[Path]:
    """The tiny ``arch`` model saved in ``root/step<N>/`` for each of ``steps`` (default 0, 10, ..., 150)."""
    steps = list(range(0, 160, 10)) if steps is None else steps
    model = tiny_model(arch, seed)
    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters()]
    directions = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(6)]
    folders = []
    for k, step in enumerate(steps):
        if k:
            with torch.no_grad():
                for i, p in enumerate(params):
                    weights = (1.0, 0.6 + 0.3 * np.sin(k), 0.35, 0.2 * np.cos(k), 0.12, 0.07)
                    p += 1e-2 * sum(w * d[i] for w, d in zip(weights, directions))
                    p += 2e-4 * torch.randn(p.shape, generator=g)
        folders.append(root / f"step{step}")
        model.save_pretrained(folders[-1], safe_serialization=True)
    return folders


def neox_head(state: dict[str, torch.Tensor], layer: int, head: int, n_heads: int) -> torch.Tensor:
    """GPT-NeoX head ``head``'s W_Q, W_K, W_V rows and W_O columns, cut by the family's own reshape
    (query_key_value's rows: head after head, q | k | v), flattened and concatenated."""
    qkv = state[f"gpt_neox.layers.{layer}.attention.query_key_value.weight"]
    dense = state[f"gpt_neox.layers.{layer}.attention.dense.weight"]
    d_model = qkv.shape[1]
    d_head = d_model // n_heads
    per_head = qkv.reshape(n_heads, 3, d_head, d_model)[head]  # [q|k|v, d_head, d_model]
    w_o = dense.reshape(d_model, n_heads, d_head)[:, head, :]  # [d_model, d_head]
    return torch.cat([per_head.reshape(-1), w_o.reshape(-1)])


def scope_vector(state: dict[str, torch.Tensor], scope: str, n_heads: int) -> np.ndarray:
    """A checkpoint's coordinates of ``scope`` (model, embed, unembed, L<i>, L<i>.attn|mlp|norm, L<i>H<j>) for
    GPT-NeoX by the family's own tensor names, float64."""
    named = {"embed": ["gpt_neox.embed_in.weight"], "unembed": ["embed_out.weight"]}
    if scope == "model":
        keys = sorted(state)
    elif scope in named:
        keys = named[scope]
    elif "." in scope:  # a layer's group: its attention, its MLP, its two layer norms
        layer, group = scope[1:].split(".")
        block = f"gpt_neox.layers.{layer}."
        prefixes = {"attn": ["attention."], "mlp": ["mlp."], "norm": ["input_layernorm.", "post_attention_layernorm."]}
        keys = sorted(k for k in state for p in prefixes[group] if k.startswith(block + p))
    elif "H" not in scope:
        keys = sorted(k for k in state if k.startswith(f"gpt_neox.layers.{scope[1:]}."))
    else:
        layer, head = map(int, scope[1:].split("H"))
        return neox_head(state, layer, head, n_heads).double().numpy()
    return torch.cat([state[k].reshape(-1).double() for k in keys]).numpy()


def independent_ratios(folders: list[Path], window: int, scope: str, n_heads: int) -> list[np.ndarray]:
    """Each rolling window's singular values of ``scope``: an SVD of its stacked updates, float64."""
    vectors = [scope_vector(load_file(f / "model.safetensors"), scope, n_heads) for f in folders]
    deltas = np.stack([b - a for a, b in zip(vectors, vectors[1:])])
    return [np.linalg.svd(deltas[i : i + window], compute_uv=False) for i in range(len(deltas) - window + 1)]
