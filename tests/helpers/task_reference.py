"""An independent implementation of the study's task metrics and head screens (docs/tasks.md,
Metrics and Screens), written the study's way for the tests: the model (loaded with
``attn_implementation="eager"``) runs in batches of 4 with ``output_attentions=True``; every
per-prompt metric is read prompt by prompt from the logits at T-1, every head's attention from
T-1 is accumulated head by head in float64 and divided by n, and heads are ranked with Python's
``sorted``. It shares no code with ``emergence/recipe/tasks/``.

Definitions the study left open follow the tool's documented choices: greater-than's mean logits
over the above / below answers are float64 means of the logits' own values, and with DD = 99 (an
empty above set) the difference is NaN.
"""

from __future__ import annotations

import numpy as np
import torch

BATCH = 4  # the study's forward batch size


def _last_position_outputs(model, tokens, output_attentions: bool):
    """Yield (first prompt index, output) for each batch of 4 prompts."""
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=model.device)
    with torch.no_grad():
        for start in range(0, len(tokens), BATCH):
            yield start, model(tokens[start : start + BATCH], output_attentions=output_attentions)


def reference_metrics(
    model, task: str, tokens, target=None, distractor=None, decade_value=None, answer_ids=None
) -> dict[str, np.ndarray]:
    """Per-prompt metrics (name -> float64 [n]) of ``task`` for ``tokens`` [n, T]: IOI / binding
    ``top1``, ``target_gt_distractor``, ``logit_diff``; greater-than ``top1_above``, ``prob_above``,
    ``prob_below``, ``logit_diff_above_below``; successor ``top1``, ``target_logit``, ``target_rank``."""
    values: dict[str, list[float]] = {}

    def put(name: str, value) -> None:
        values.setdefault(name, []).append(float(value))

    for start, out in _last_position_outputs(model, tokens, output_attentions=False):
        logits = out.logits[:, -1, :]  # [b, V], the model's dtype
        for i in range(len(logits)):
            row, prompt = logits[i], start + i
            predicted = int(row.argmax())
            if task in ("ioi", "binding"):
                t, d = int(target[prompt]), int(distractor[prompt])
                put("top1", predicted == t)
                put("target_gt_distractor", bool(row[t] > row[d]))
                put("logit_diff", (row[t] - row[d]).item())
            elif task == "greater_than":
                decade = int(decade_value[prompt])
                above = [int(answer_ids[d]) for d in range(decade + 1, 100)]
                below = [int(answer_ids[d]) for d in range(0, decade + 1)]
                probs = torch.softmax(row.float(), dim=-1)
                put("top1_above", predicted in above)
                put("prob_above", probs[above].sum().item())
                put("prob_below", probs[below].sum().item())
                put("logit_diff_above_below", row[above].double().mean().item() - row[below].double().mean().item())
            elif task == "successor":
                t = int(target[prompt])
                put("top1", predicted == t)
                put("target_logit", row[t].item())
                put("target_rank", int((row > row[t]).sum()))
            else:
                raise ValueError(task)
    return {name: np.array(v, dtype=np.float64) for name, v in values.items()}


def reference_screens(
    model, task: str, tokens, positions: dict[str, np.ndarray], k: int = 5
) -> tuple[dict[str, np.ndarray], dict[str, list[tuple[int, int]]]]:
    """Per-head scores (name -> [layers, heads]) and ranked top-``k`` heads (screen -> [(layer, head)])
    of ``task`` for ``tokens`` [n, T] with the batch's named ``positions`` (name -> [n])."""
    n, T = np.asarray(tokens).shape
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    if task == "ioi":
        keys = {"io": positions["io"], "s1": positions["s1"], "s2": positions["s2"]}
    elif task == "greater_than":
        keys = {"decade": positions["decade"], "century": positions["century"]}
    elif task == "successor":  # the study's fixed positions: 4 (itself) and 3 at T = 5
        keys = {"self": np.full(n, T - 1), "prev": np.full(n, T - 2)}
    elif task == "binding":
        keys = {
            "binding": positions["binding"],
            "distractor": positions["distractor"],
            "query_name": positions["query_name"],
        }
    else:
        raise ValueError(task)
    sums = {name: np.zeros((layers, heads)) for name in (*keys, "row")}
    for start, out in _last_position_outputs(model, tokens, output_attentions=True):
        for layer, attention in enumerate(out.attentions):  # [b, heads, T, T]
            for i in range(attention.shape[0]):
                for head in range(heads):
                    row = attention[i, head, T - 1].double().cpu()
                    for name, where in keys.items():
                        sums[name][layer, head] += row[int(where[start + i])].item()
                    sums["row"][layer, head] += row.sum().item()
    mean = {name: s / n for name, s in sums.items()}

    def per_head(score) -> np.ndarray:
        return np.array([[score(l, h) for h in range(heads)] for l in range(layers)])

    all_heads = [(l, h) for l in range(layers) for h in range(heads)]

    def top(score: np.ndarray, candidates=all_heads) -> list[tuple[int, int]]:
        return sorted(candidates, key=lambda lh: score[lh], reverse=True)[:k]

    other = per_head(lambda l, h: mean["row"][l, h] - sum(mean[name][l, h] for name in keys))
    if task == "ioi":
        io, s1, s2 = mean["io"], mean["s1"], mean["s2"]
        subj_max = per_head(lambda l, h: max(s1[l, h], s2[l, h]))
        ratio = per_head(lambda l, h: subj_max[l, h] / max(io[l, h], 1e-6))
        nm_sel = per_head(lambda l, h: io[l, h] / max(max(s1[l, h], s2[l, h]), 1e-6))
        s_inhibition = [lh for lh in all_heads if ratio[lh] >= 2.0 and subj_max[lh] >= 0.1]
        scores = {
            "io_attn": io,
            "s1_attn": s1,
            "s2_attn": s2,
            "other_attn": other,
            "nm_sel": nm_sel,
            "subj_max": subj_max,
            "subj_ratio": ratio,
        }
        return scores, {"name_mover": top(nm_sel), "s_inhibition": top(subj_max, s_inhibition)}
    if task == "greater_than":
        gt_sel = per_head(lambda l, h: mean["decade"][l, h] / max(other[l, h] / (T - 2), 1e-8))
        scores = {"decade_attn": mean["decade"], "century_attn": mean["century"], "other_attn": other, "gt_sel": gt_sel}
        return scores, {"greater_than": top(gt_sel)}
    if task == "successor":
        succ_sel = per_head(lambda l, h: mean["self"][l, h] / max(other[l, h] / (T - 2), 1e-8))
        scores = {"self_attn": mean["self"], "prev_attn": mean["prev"], "other_attn": other, "succ_sel": succ_sel}
        return scores, {"successor": top(succ_sel)}
    vb_sel = per_head(lambda l, h: mean["binding"][l, h] / max(other[l, h] / (T - 3), 1e-8))
    scores = {
        "binding_attn": mean["binding"],
        "distractor_attn": mean["distractor"],
        "query_name_attn": mean["query_name"],
        "other_attn": other,
        "vb_sel": vb_sel,
    }
    return scores, {"binding": top(vb_sel)}


# --- Tiny models for the tests ---------------------------------------------------------------------

TINY_ARCHS = ("gpt_neox", "olmo", "llama")
TINY_VOCAB = 128  # room for greater-than's 100 answer tokens


def tiny_task_model(arch: str, seed: int = 0):
    """A random-init eager model: hidden 32, 2 layers, 4 heads (head_dim 8), vocabulary 128."""
    from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig, OlmoConfig

    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config = {"gpt_neox": GPTNeoXConfig, "olmo": OlmoConfig, "llama": LlamaConfig}[arch](**common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def plant_marker_head(model, arch: str, head: int, marker_ids, sharpness: float = 4.0) -> None:
    """Make layer 0's ``head`` attend from every query to the tokens ``marker_ids``.

    The embeddings get two hand-set hidden directions: dimension 1 is 1.0 for every token (a
    constant the query reads) and dimension 0 is 1.0 for the markers, 0 for every other token (what
    the key reads); after the layer's norm both stay large (~4-5.6) where set. The head's query and
    key read only dimension 1 and 0 respectively, ``sharpness`` times, into head dimension 3, and
    nothing else: the score is ~+120 for a marker key and ~-6 for any other. Head dimension 3 pairs
    with 7 under rotary embeddings at the lowest frequency (10000^(-3/4) rad per position, 0.01 rad
    over 14 positions), and GPT-NeoX rotates only dimensions 0-1: position barely moves the score."""
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight  # [V, hidden]
        embedding[:, 0] = 0.0
        embedding[list(marker_ids), 0] = 1.0
        embedding[:, 1] = 1.0
        if arch == "gpt_neox":  # fused rows, per head: query, key, value (head_dim each)
            fused = model.gpt_neox.layers[0].attention.query_key_value
            query_rows = slice(3 * head * head_dim, 3 * head * head_dim + head_dim)
            key_rows = slice(query_rows.stop, query_rows.stop + head_dim)
            query, key = fused.weight[query_rows], fused.weight[key_rows]
            fused.bias[query_rows] = 0.0
            fused.bias[key_rows] = 0.0
        else:  # separate q_proj / k_proj, rows head-major, no bias
            attention = model.model.layers[0].self_attn
            rows = slice(head * head_dim, (head + 1) * head_dim)
            query, key = attention.q_proj.weight[rows], attention.k_proj.weight[rows]
        query.zero_()
        key.zero_()
        query[3, 1] = sharpness
        key[3, 0] = sharpness
