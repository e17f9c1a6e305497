"""An independent implementation of docs/method.md sections 3-5 for the tests: the model's
own eager attention with ``output_attentions=True`` (full [b, h, T, T] patterns), and the
head outputs read by a hook on the output projection, reduced with plain numpy."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM

# Written out per family from the transformers source, independently of ``capture.discover``.
_LLAMA_LIKE = lambda m: [l.self_attn.o_proj for l in m.model.layers]  # noqa: E731
OUT_PROJ = {
    "gpt_neox": lambda m: [l.attention.dense for l in m.gpt_neox.layers],
    "gpt2": lambda m: [b.attn.c_proj for b in m.transformer.h],  # Conv1D: its input is [b, T, heads*d] too
    **dict.fromkeys(("olmo", "olmoe", "olmo2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2"), _LLAMA_LIKE),
}
DECODER_LAYERS = {
    "gpt_neox": lambda m: list(m.gpt_neox.layers),
    "gpt2": lambda m: list(m.transformer.h),
    **dict.fromkeys(
        ("olmo", "olmoe", "olmo2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2"),
        lambda m: list(m.model.layers),
    ),
}


def eager_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def eager_targets(model, tokens: torch.Tensor, ab: torch.Tensor, baseline) -> np.ndarray:
    """[n, layers, heads, 7]: attention from T-1 to induction, duplicate, previous, self,
    first, local (mean T-3..T-6), baseline (mean) targets, from full eager patterns."""
    with torch.no_grad():
        attentions = model(tokens, output_attentions=True).attentions
    T = tokens.shape[1]
    out = []
    for att in attentions:  # [n, h, T, T]
        row = att[:, :, T - 1, :].double().numpy()
        n = row.shape[0]
        ind = np.stack([row[i, :, ab[i] + 1] for i in range(n)])
        dup = np.stack([row[i, :, ab[i]] for i in range(n)])
        local = row[:, :, [T - 3, T - 4, T - 5, T - 6]].mean(-1)
        base = row[:, :, list(baseline)].mean(-1)
        out.append(np.stack([ind, dup, row[:, :, T - 2], row[:, :, T - 1], row[:, :, 0], local, base], -1))
    return np.stack(out, 1)


def eager_sink_importance(model, tokens: torch.Tensor) -> np.ndarray:
    """[n, layers, heads]: Gu et al.'s importance of key 0, the mean of column 0 of the full eager
    pattern over the queries that can see key 0 (those it gets any attention from: a sliding
    window's far queries give it exactly 0)."""
    with torch.no_grad():
        attentions = model(tokens, output_attentions=True).attentions
    out = []
    for att in attentions:  # [n, h, T, T]
        column = att[..., 0].double().numpy()  # [n, h, T]
        sees = column > 0
        out.append(np.where(sees, column, 0).sum(-1) / sees.sum(-1))
    return np.stack(out, 1)


def head_outputs_at_last(model, arch: str, tokens: torch.Tensor, n_heads: int) -> np.ndarray:
    """[n, layers, heads, d]: each head's slice of the output projection's input at T-1."""
    grabbed = []
    hooks = [
        p.register_forward_pre_hook(lambda m, args: grabbed.append(args[0][:, -1].double().clone()))
        for p in OUT_PROJ[arch](model)
    ]
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    x = torch.stack(grabbed, 1)  # [n, layers, hidden]
    return x.view(x.shape[0], x.shape[1], n_heads, -1).numpy()


def pr_centred_cov(x: np.ndarray) -> float:
    """(sum l)^2 / sum l^2 over eigenvalues of np.cov of the rows of x [n, d]."""
    lam = np.clip(np.linalg.eigvalsh(np.cov(x, rowvar=False)), 0, None)
    return lam.sum() ** 2 / (lam**2).sum()


def entropy_rank_svd(x: np.ndarray) -> float:
    s = np.linalg.svd(x, compute_uv=False)
    p = s**2 / (s**2).sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def eager_residual_and_values(path, arch: str, tokens: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each decoder layer's output [n, T, D] (a hook on the layers named per family) and the values
    each attention layer's eager function receives [n, h_kv, T, d] (transformers' own eager function,
    wrapped), float64."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward  # the one with a softcap

    values: list[np.ndarray] = []

    def eager_keeping_values(module, query, key, value, attention_mask, **kwargs):
        values.append(value.double().numpy().copy())
        if kwargs.get("softcap") is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test_keep_values", eager_keeping_values)
    AttentionMaskInterface.register("test_keep_values", eager_mask)  # every layer its additive mask
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    model.set_attn_implementation("test_keep_values")
    hidden: list[np.ndarray] = []
    hooks = [
        layer.register_forward_hook(
            lambda m, args, out: hidden.append((out[0] if isinstance(out, tuple) else out).double().numpy().copy())
        )
        for layer in DECODER_LAYERS[arch](model)
    ]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return hidden, values


def reference_head_weights(model, arch: str) -> list[dict[str, torch.Tensor]]:
    """Per layer, W_Q / W_K / W_V [heads, d_model, d_head] and W_O [heads, d_head, d_model], cut per family
    as TransformerLens's weight conversions cut them (written from the transformers source, independently of
    ``head_weights.layer_slices``): reshapes of whole weights, grouped K/V repeated over their heads."""
    cfg = model.config
    heads = cfg.num_attention_heads
    out = []
    if arch == "gpt2":
        d = cfg.n_embd
        for block in model.transformer.h:
            q, k, v = block.attn.c_attn.weight.split(d, dim=1)  # Conv1D [d_model, 3 d_model]
            cut = lambda w: w.reshape(d, heads, -1).permute(1, 0, 2)  # noqa: E731
            out.append(
                {"W_Q": cut(q), "W_K": cut(k), "W_V": cut(v), "W_O": block.attn.c_proj.weight.reshape(heads, -1, d)}
            )
        return out
    if arch == "gpt_neox":
        d = cfg.hidden_size
        for layer in model.gpt_neox.layers:
            w = layer.attention.query_key_value.weight.reshape(heads, 3, -1, d)  # [heads, (q, k, v), d_head, d_model]
            out.append(
                {
                    "W_Q": w[:, 0].transpose(1, 2),
                    "W_K": w[:, 1].transpose(1, 2),
                    "W_V": w[:, 2].transpose(1, 2),
                    "W_O": layer.attention.dense.weight.reshape(d, heads, -1).permute(1, 2, 0),
                }
            )
        return out
    d = cfg.hidden_size
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    for layer in model.model.layers:
        attn = layer.self_attn
        d_head = attn.o_proj.weight.shape[1] // heads
        if arch == "phi3":
            q, k, v = attn.qkv_proj.weight.split([heads * d_head, kv * d_head, kv * d_head], dim=0)
        else:
            q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight

        def per_head(w, n, d_head=d_head):
            return w.reshape(n, d_head, d).transpose(1, 2).repeat_interleave(heads // n, 0)

        out.append(
            {
                "W_Q": per_head(q, heads),
                "W_K": per_head(k, kv),
                "W_V": per_head(v, kv),
                "W_O": attn.o_proj.weight.reshape(d, heads, d_head).permute(1, 2, 0),
            }
        )
    return out


def reference_weight_circuits(model, arch: str) -> dict[str, np.ndarray]:
    """The weight-circuit columns [layers, heads], dense and in float64 (independently of
    ``measures.weight_circuits``): the eigenvalues of the whole [d_vocab, d_vocab] OV circuit
    W_E W_V W_O W_U, and the SVDs of the whole [d_model, d_model] W_Q W_K^T and W_V W_O."""
    W_E = model.get_input_embeddings().weight.detach().double().numpy()
    W_U = model.lm_head.weight.detach().double().numpy().T  # every tested family names it so
    columns: dict[str, list] = {
        name: [] for name in ("ov_copying", "qk_sigma1", "qk_stable_rank", "ov_sigma1", "ov_stable_rank")
    }
    for layer in reference_head_weights(model, arch):
        W_Q, W_K, W_V, W_O = (layer[name].detach().double().numpy() for name in ("W_Q", "W_K", "W_V", "W_O"))
        row: dict[str, list] = {name: [] for name in columns}
        for h in range(W_Q.shape[0]):
            eigenvalues = np.linalg.eigvals(W_E @ W_V[h] @ W_O[h] @ W_U)
            row["ov_copying"].append(eigenvalues.real.sum() / np.abs(eigenvalues).sum())
            for name, product in (("qk", W_Q[h] @ W_K[h].T), ("ov", W_V[h] @ W_O[h])):
                s = np.linalg.svd(product, compute_uv=False)
                row[f"{name}_sigma1"].append(s[0])
                row[f"{name}_stable_rank"].append((s**2).sum() / s[0] ** 2)
        for name in columns:
            columns[name].append(row[name])
    return {name: np.array(grid) for name, grid in columns.items()}


def eager_attention_entropy(model, tokens: torch.Tensor) -> np.ndarray:
    """[layers, heads]: the entropy (nats) of each query's row of the full eager pattern, averaged over
    the queries 1..T-1 and the sequences, in float64."""
    with torch.no_grad():
        attentions = model(tokens, output_attentions=True).attentions
    out = []
    for att in attentions:  # [n, h, T, T]
        p = att[:, :, 1:].double().numpy()
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        out.append(-plogp.sum(-1).mean((0, 2)))
    return np.stack(out)
