"""Step 4 - causal verification by group ablation (METHOD.md section 6).

An ablated head has its slice of the input to the output projection replaced: by zero
(``zero``, the reference) or by its batch mean at that position (``mean``). We score
the prediction of B at T-1 for the induction circuit ablated and for matched-random
control sets (same number of heads from the same layers). Conditions are stacked along
the batch dimension, so all control sets share each forward pass.
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from emergence.probe import ProbeBatch
from emergence.screen import head_name, parse_head_name

METRICS = ("loss", "top1", "top5", "logit_b")


def score_logits(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """logits [b, V] at T-1, target [b] -> metric *sums* over the b sequences."""
    logits = logits.float()
    if not torch.isfinite(logits).all():
        raise FloatingPointError("non-finite logits (NaN or inf): rerun with model.dtype=float32")
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    return {
        "loss": F.cross_entropy(logits, target, reduction="sum").item(),
        "top1": (top5[:, 0] == target).sum().item(),
        "top5": (top5 == target[:, None]).any(-1).sum().item(),
        "logit_b": logits.gather(1, target[:, None]).sum().item(),
    }


def _per_layer(circuit: list[tuple[int, int]]) -> Counter:
    return Counter(layer for layer, _ in circuit)


def control_shortfall(circuit: list[tuple[int, int]], n_heads: int) -> str | None:
    """Why no matched control exists (a layer with fewer non-circuit heads than circuit heads), or None."""
    short = [f"L{layer} ({k} circuit heads, {n_heads - k} others)"
             for layer, k in sorted(_per_layer(circuit).items()) if n_heads - k < k]
    return None if not short else "no matched-random control: too few non-circuit heads in " + ", ".join(short)


def matched_random_sets(circuit: list[tuple[int, int]], n_heads: int, n_sets: int,
                        seed: int) -> list[list[tuple[int, int]]]:
    """Up to ``n_sets`` distinct head sets with as many heads per layer as the circuit, drawn
    without replacement from that layer's non-circuit heads (check ``control_shortfall``
    first). Fewer when fewer distinct sets exist: 2 circuit heads of 4 leave exactly one."""
    rng = np.random.default_rng(seed)
    in_circuit = set(circuit)
    pools = {layer: [h for h in range(n_heads) if (layer, h) not in in_circuit]
             for layer in _per_layer(circuit)}
    n_distinct = math.prod(math.comb(len(pools[layer]), k) for layer, k in _per_layer(circuit).items())
    sets: list[list[tuple[int, int]]] = []
    while len(sets) < min(n_sets, n_distinct):
        heads = [(layer, int(h)) for layer, k in sorted(_per_layer(circuit).items())
                 for h in sorted(rng.choice(pools[layer], size=k, replace=False))]
        if heads not in sets:
            sets.append(heads)
    return sets


def effect(clean_loss: float, circuit_loss: float, control_losses: list[float], causal_factor: float) -> dict:
    """How much the circuit's ablation raises the loss of B, against the controls' mean rise.

    The ratio is only defined over a positive control rise: over zero or a fall it would
    read as "no effect" or flip its sign, so it is None then. ``causal``: the circuit's rise
    exceeds ``causal_factor`` times the size of the controls' mean change, a fall counting
    by its size, so that noise around zero does not pass; None without controls."""
    circuit_rise = circuit_loss - clean_loss
    if not control_losses:
        return {"circuit_loss_increase": circuit_rise, "random_loss_increase_mean": None, "ratio": None,
                "causal": None}
    control_rise = float(np.mean(control_losses) - clean_loss)
    return {"circuit_loss_increase": circuit_rise,
            "random_loss_increase_mean": control_rise,
            "ratio": circuit_rise / control_rise if control_rise > 0 else None,
            "causal": bool(circuit_rise > causal_factor * abs(control_rise))}


def head_mask(heads: list[tuple[int, int]], n_layers: int, n_heads: int) -> torch.Tensor:
    """[layers, heads] bool, True where the head is ablated."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    return mask


@contextmanager
def ablating(arch, row_masks: torch.Tensor, position_mean: torch.Tensor | None = None):
    """Ablate heads per batch row while active.

    ``row_masks`` [rows, layers, heads] bool: which heads to ablate in each batch row.
    ``position_mean`` [layers, T, heads, d]: replacement values for mean ablation
    (None: zero ablation). Layers with nothing ablated are left untouched.
    """
    handles = []

    def make_hook(layer: int):
        ablated = row_masks[:, layer]

        def hook(module, args):
            x = args[0]
            rows, T, _ = x.shape
            heads = x.view(rows, T, arch.n_heads, arch.head_dim)
            drop = ablated.to(x.device)[:, None, :, None]  # [rows, 1, heads, 1]
            fill = torch.zeros((), dtype=x.dtype, device=x.device) if position_mean is None \
                else position_mean[layer].to(x.device)  # [T, heads, d]
            return (torch.where(drop, fill, heads).view(rows, T, -1), *args[1:])

        return hook

    for layer, proj in enumerate(arch.out_projs):
        if row_masks[:, layer].any():
            handles.append(proj.register_forward_pre_hook(make_hook(layer)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def run_ablation(model, arch, batch: ProbeBatch, conditions: dict[str, list[tuple[int, int]]],
                 batch_size: int, position_mean: torch.Tensor | None = None) -> dict[str, dict[str, float]]:
    """Mean metrics of B at T-1 for each named head set ablated (all sets share each pass)."""
    names = list(conditions)
    masks = torch.stack([head_mask(conditions[c], arch.n_layers, arch.n_heads) for c in names])
    k = len(names)
    per_pass = max(1, batch_size // k)  # sequences per forward, each repeated once per condition
    device = next(model.parameters()).device
    sums = {c: dict.fromkeys(METRICS, 0.0) for c in names}
    with torch.inference_mode():
        for start in tqdm(range(0, batch.n, per_pass), desc="ablate", unit="batch", leave=False):
            stop = min(start + per_pass, batch.n)
            b = stop - start
            tokens = batch.tokens[start:stop].to(device).repeat(k, 1)  # condition-major rows
            row_masks = masks.repeat_interleave(b, dim=0)
            with ablating(arch, row_masks, position_mean):
                logits = model(tokens, logits_to_keep=1).logits[:, -1]
            target = batch.b[start:stop].to(device)
            for i, c in enumerate(names):
                for m, v in score_logits(logits[i * b:(i + 1) * b], target).items():
                    sums[c][m] += v
    return {c: {m: v / batch.n for m, v in s.items()} for c, s in sums.items()}


def ablate(settings, model, arch, batch: ProbeBatch, batch_size: int, circuit: list[tuple[int, int]],
           clean_metrics: dict, position_mean: torch.Tensor | None) -> dict:
    """The ablation step's record: clean vs ``circuit`` ablated vs matched-random controls.

    ``settings`` is the run's ``AblateConfig``; with ``settings.heads`` set, those heads
    (validated against the model's shape before the probe pass) replace the screened
    ``circuit``. ``clean_metrics`` come from the probe pass, ``position_mean`` (mean
    ablation) from its capture."""
    result: dict = {"enabled": settings.enabled, "mode": settings.mode, "causal_factor": settings.causal_factor,
                    "clean": clean_metrics, "circuit": None, "random": [], "effect": None}
    if settings.heads is not None:  # the user's head set instead of the screened circuit
        circuit = [parse_head_name(h) for h in settings.heads]
        result["heads"] = list(settings.heads)
    if not settings.enabled:
        return result
    if not circuit:
        result["note"] = "empty induction circuit: nothing to ablate"
        return result
    shortfall = control_shortfall(circuit, arch.n_heads)
    controls = [] if shortfall else matched_random_sets(circuit, arch.n_heads, settings.n_random, settings.seed)
    conditions = {"circuit": circuit, **{f"random_{i}": heads for i, heads in enumerate(controls)}}
    scores = run_ablation(model, arch, batch, conditions, batch_size, position_mean)
    result["circuit"] = scores["circuit"]
    result["random"] = [{**scores[f"random_{i}"], "heads": [head_name(*h) for h in heads]}
                        for i, heads in enumerate(controls)]
    result["effect"] = effect(clean_metrics["loss"], scores["circuit"]["loss"],
                              [s["loss"] for s in result["random"]], settings.causal_factor)
    if shortfall:
        result["note"] = shortfall
    elif result["effect"]["ratio"] is None:
        result["note"] = (f"the matched-random controls did not raise the loss of B "
                          f"(mean {result['effect']['random_loss_increase_mean']:+.4f}): no ratio")
    return result
