"""Step 4 - causal verification by group ablation (docs/method.md section 6).

An ablated head has its slice of the input to the output projection replaced: by zero
(``zero``, the reference) or by its batch mean at that position (``mean``). We score
the prediction of B at T-1 for the induction circuit ablated and for control sets, "controls"
(as many heads per layer as the circuit, drawn at random: ``draw_controls``). Conditions are
stacked along the batch dimension (``stacked_logits``), so all control sets share each forward pass. The step's
result is an ``AblationResult``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from tqdm.auto import tqdm

from emergence.core.config import AblateConfig, StatsConfig
from emergence.core.record import Record
from emergence.recipe import capture, stats, verdict
from emergence.recipe.controls import count_distinct, first_distinct, heads_of, matched_draw
from emergence.recipe.probe import ProbeBatch
from emergence.recipe.screen import head_name, head_of

METRICS = ("loss", "top1", "top5", "logit_b")


@dataclass
class Metrics(Record):
    """Next-token metrics of B at T-1, means over the sequences scored."""

    loss: float  # cross-entropy of B (nats)
    top1: float  # share of sequences whose top-1 prediction is B
    top5: float  # share whose top-5 predictions hold B
    logit_b: float  # B's logit

    @classmethod
    def of(cls, means: dict[str, float]) -> Metrics:
        return cls(**{m: float(means[m]) for m in METRICS})


@dataclass
class ControlSet(Record):
    """One control set: its heads ablated together, and the metrics of B then."""

    heads: list[str]  # "L4H4", ...
    metrics: Metrics
    drawn: str = "in-layer"  # in-layer (from the circuit's own layers) | fallback (``draw_controls``)


@dataclass
class ControlDraw(Record):
    """How the control sets were drawn (``draw_controls``; ``summary.json`` ``ablation.control_draw``)."""

    asked: int  # ablate.n_controls
    in_layer: int  # sets drawn from the circuit's own layers
    fallback: int  # sets drawn by the fallback
    fallback_layers: dict[str, str]  # per circuit layer moved by the fallback, the layer its heads come from
    set_aside_level: float  # the induction selectivity from which on a head is never a control
    set_aside: list[str]  # the heads at or above it, outside the ablated set: never in a control set
    note: str | None = None  # why the sets are not the asked number in-layer (``Controls.note``)


@dataclass
class Effect(Record):
    """How much the circuit's ablation raises the loss of B, against the controls' mean rise (nats)."""

    circuit_loss_increase: float
    controls_loss_increase_mean: float | None  # None without controls
    ratio: float | None  # circuit rise / controls' rise; None unless the controls raised the loss
    causal: bool | None  # the circuit's rise exceeds causal_factor x |controls' rise|; None without controls
    intervals: dict | None = None  # ``stats.effect_intervals``: paired bootstrap over the sequences used


@dataclass
class AblationResult(Record):
    """The ablation step's record (``summary.json`` ``ablation``): clean vs the circuit ablated vs controls."""

    enabled: bool
    mode: str  # zero | mean
    causal_factor: float
    sequences: str  # adaptive | all
    clean: Metrics  # the probe pass's clean metrics, over every sequence
    heads: list[str] | None = None  # the user's head set (ablate.heads), ablated instead of the screened circuit
    circuit: Metrics | None = None  # None: not ablated (disabled, or an empty circuit)
    controls: list[ControlSet] = field(default_factory=list)
    control_draw: ControlDraw | None = None  # how the controls were drawn; None: not ablated
    effect: Effect | None = None
    sequences_used: int | None = None  # the first n probe sequences ablated (adaptive runs stop early)
    stopped_early: bool | None = None
    clean_loss_used: float | None = None  # the clean loss of B over the sequences used: the effect's baseline
    interval: dict | None = None  # the causal criterion's interval (``verdict.interval``)
    note: str | None = None  # why there is no verdict or no ratio


def metrics_per_sequence(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits [b, V] at T-1, target [b] -> [b, 4] float64: each sequence's loss of B, whether B
    is the top-1 and within the top-5 prediction, and B's logit (order ``METRICS``)."""
    logits = logits.float()
    if not torch.isfinite(logits).all():
        raise FloatingPointError("non-finite logits (NaN or inf): rerun with model.dtype=float32")
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    return torch.stack(
        [
            F.cross_entropy(logits, target, reduction="none"),
            top5[:, 0] == target,
            (top5 == target[:, None]).any(-1),
            logits.gather(1, target[:, None])[:, 0],
        ],
        dim=-1,
    ).double()


CAUSAL = "causal"  # the induction ablation's one verdict (``AdaptiveStop``)
MIN_CONTROLS = 3  # fewer distinct in-layer sets than this: the fallback widens the draw


def set_aside_heads(induction_sel: np.ndarray, level: float, ablated: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The heads outside ``ablated`` whose induction selectivity ([layers, heads]) reaches ``level``:
    they nearly do the circuit's job, so a control holding one would hide the circuit's effect."""
    ablated_set = set(ablated)
    return [(int(l), int(h)) for l, h in np.argwhere(induction_sel >= level) if (l, h) not in ablated_set]


@dataclass(frozen=True)
class Controls:
    """``draw_controls``' answer: the sets, in-layer ones first, and how they were drawn."""

    sets: list[list[tuple[int, int]]]
    in_layer: int  # the first ``in_layer`` sets come from the circuit's own layers, the rest by the fallback
    fallback_layers: dict[int, int]  # circuit layer -> the layer the fallback draws its heads from
    in_layer_exist: int  # distinct in-layer sets there are

    def note(self, asked: int) -> str | None:
        """Why the sets are not ``asked`` in-layer ones, in words (the counts are the record's)."""
        if self.in_layer == asked:
            return None
        if not self.sets:
            return "no control set: no layer has room for the circuit's heads outside the circuit"
        said = [f"{self.in_layer_exist} distinct in-layer sets exist"]
        if len(self.sets) == self.in_layer < MIN_CONTROLS:
            said.append("no layer has room for the fallback")
        if len(self.sets) < MIN_CONTROLS:
            said.append(f"the verdict rests on {len(self.sets)} (fewer than {MIN_CONTROLS})")
        return "; ".join(said)


def _counts(layout: dict[int, int], per_layer: Counter) -> dict[int, int]:
    """A draw's counts: circuit layer l's k heads from layer ``layout[l]`` (one circuit layer per
    layer), the layers walked in ascending circuit order."""
    return {layout[layer]: k for layer, k in sorted(per_layer.items())}


def _n_distinct(counts: dict[int, int], pools: dict[int, list[int]]) -> int:
    """Distinct sets of exactly ``counts``' heads per layer: none where a pool lacks room."""
    return count_distinct(counts, pools) if all(len(pools[layer]) >= k for layer, k in counts.items()) else 0


def _draw(
    counts: dict[int, int], pools: dict[int, list[int]], n: int, rng: np.random.Generator
) -> list[list[tuple[int, int]]]:
    """``n`` distinct sets (no more than exist; ``controls.matched_draw``), each as sorted (layer, head) pairs."""
    draws = ((None, matched_draw(counts, pools, rng)) for _ in itertools.count())
    return [sorted(heads_of(control)) for _, control in first_distinct(draws, min(n, _n_distinct(counts, pools)))]


def _fallback_layout(per_layer: Counter, pools: dict[int, list[int]], n_layers: int) -> dict[int, int] | None:
    """Each circuit layer whose own layer gives fewer than ``MIN_CONTROLS`` distinct draws (none where
    it has too few eligible heads) moves to the nearest layer with room for its heads that holds no
    circuit head, one circuit layer per layer; the others stay. (Two circuit layers swapping would
    draw the in-layer sets again.) Ties go to the higher layer: the previous-token heads an
    induction head reads from sit below it, and ablating them disables the circuit itself. None:
    some layer finds no room."""
    moving = [l for l, k in sorted(per_layer.items()) if math.comb(len(pools[l]), k) < MIN_CONTROLS]
    layout = {l: l for l in per_layer if l not in moving}
    for layer in moving:
        room = [
            m
            for m in sorted(range(n_layers), key=lambda m: (abs(m - layer), -m))
            if m not in per_layer and m not in layout.values() and len(pools[m]) >= per_layer[layer]
        ]
        if not room:
            return None
        layout[layer] = room[0]
    return layout


def draw_controls(
    circuit: list[tuple[int, int]],
    n_layers: int,
    n_heads: int,
    n_sets: int,
    seed: int,
    set_aside: Sequence[tuple[int, int]] = (),
) -> Controls:
    """Up to ``n_sets`` distinct control sets with as many heads per layer as the circuit, never a
    circuit head nor one of ``set_aside``.

    In-layer first: each layer's heads from the same layer. When fewer than ``MIN_CONTROLS``
    distinct in-layer sets exist (none where a layer lacks room), the fallback widens the draw:
    the circuit layers short of draws take their heads from the nearest layer with room that holds
    no circuit head (``_fallback_layout``), and its sets fill up to ``n_sets``. Those differ from
    every in-layer set (some of their heads lie in a layer outside the circuit's). Reproducible
    from ``seed``."""
    per_layer = Counter(layer for layer, _ in circuit)
    excluded = set(circuit) | set(set_aside)
    pools = {layer: [h for h in range(n_heads) if (layer, h) not in excluded] for layer in range(n_layers)}
    rng = np.random.default_rng(seed)
    in_layer_counts = _counts({layer: layer for layer in per_layer}, per_layer)
    in_layer = _draw(in_layer_counts, pools, n_sets, rng)
    in_layer_exist = _n_distinct(in_layer_counts, pools)
    fallback: list[list[tuple[int, int]]] = []
    layout: dict[int, int] = {}
    if in_layer_exist < MIN_CONTROLS:
        found = _fallback_layout(per_layer, pools, n_layers)
        if found is not None:
            layout = {c: f for c, f in found.items() if c != f}
            fallback = _draw(_counts(found, per_layer), pools, n_sets - len(in_layer), rng)
    return Controls(in_layer + fallback, len(in_layer), layout if fallback else {}, in_layer_exist)


def effect(clean_loss: float, circuit_loss: float, control_losses: list[float], causal_factor: float) -> Effect:
    """How much the circuit's ablation raises the loss of B, against the controls' mean rise.

    The ratio is only defined over a positive control rise: over zero or a fall it would
    read as "no effect" or flip its sign, so it is None then. ``causal``: the circuit's rise
    exceeds ``causal_factor`` times the size of the controls' mean change, a fall counting
    by its size, so that noise around zero does not pass; None without controls."""
    circuit_rise = circuit_loss - clean_loss
    if not control_losses:
        return Effect(circuit_rise, None, None, None)
    control_rise = float(np.mean(control_losses) - clean_loss)
    return Effect(
        circuit_rise,
        control_rise,
        circuit_rise / control_rise if control_rise > 0 else None,
        bool(circuit_rise > causal_factor * abs(control_rise)),
    )


def head_mask(heads: list[tuple[int, int]], n_layers: int, n_heads: int) -> torch.Tensor:
    """[layers, heads] bool, True where the head is ablated."""
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    return mask


@contextmanager
def removed_after(handles: list):
    """Hooks (``handles``) stay for the body, and are removed however it ends."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def ablating(
    arch: capture.Architecture, layer_masks: Sequence[torch.Tensor | None], position_mean: torch.Tensor | None = None
):
    """Ablate heads per batch row while active.

    ``layer_masks[layer]`` [rows, heads] bool: which heads to ablate in each row of the batch as it
    enters that layer (None: nothing). ``position_mean`` [layers, T, heads, d]: replacement values
    for mean ablation (None: zero ablation). Layers with nothing ablated are left untouched.
    """
    handles = []

    def make_hook(layer: int):
        ablated = layer_masks[layer]
        assert ablated is not None  # hooked only where a head is ablated

        def hook(module, args):
            x = args[0]
            rows, T, _ = x.shape
            heads = x.view(rows, T, arch.n_heads, arch.head_dim)
            drop = ablated.to(x.device)[:, None, :, None]  # [rows, 1, heads, 1]
            fill = (
                torch.zeros((), dtype=x.dtype, device=x.device)
                if position_mean is None
                else position_mean[layer].to(x.device)
            )  # [T, heads, d]
            return (torch.where(drop, fill, heads).view(rows, T, -1), *args[1:])

        return hook

    for layer, proj in enumerate(arch.out_projs):
        mask = layer_masks[layer]
        if mask is not None and mask.any():
            handles.append(proj.register_forward_pre_hook(make_hook(layer)))
    with removed_after(handles):
        yield


CLEAN = None  # the block of rows with nothing ablated (``StackLayout.blocks``)


@dataclass(frozen=True)
class StackLayout:
    """How k head sets share one forward pass over the same ``rows`` sequences.

    A head set's rows compute what the clean model computes up to its lowest ablated layer, so the
    batch starts as one block of clean rows, and each set joins as a copy of them at its lowest
    ablated layer: the layers below run once for all the sets that join above. ``blocks[layer]`` is
    the blocks of ``rows`` rows entering that layer, in order: the clean rows first (``CLEAN``) while
    a set is still to join or an empty head set needs them to the end, then the sets in the order
    they joined (by lowest layer, then as given)."""

    rows: int
    blocks: list[list[int | None]]  # per layer: a head set's index, or CLEAN
    owner: list[int | None]  # per head set: its block at the top (CLEAN for a set with no head)

    @classmethod
    def of(cls, masks: torch.Tensor, rows: int) -> StackLayout:
        """``masks`` [k, layers, heads] bool: the k head sets."""
        k, n_layers, _ = masks.shape
        per_layer = masks.any(dim=2)  # [k, layers]
        lowest = [int(row.nonzero()[0]) if row.any() else None for row in per_layer]
        joins = {s: low for s, low in enumerate(lowest) if low is not None}  # a set with a head: its lowest layer
        joining = sorted(joins, key=lambda s: (joins[s], s))
        last_join = max(joins.values(), default=-1)
        keep_clean = any(low is None for low in lowest)
        blocks: list[list[int | None]] = []
        for layer in range(n_layers):
            clean: list[int | None] = [CLEAN] if keep_clean or layer < last_join else []
            blocks.append(clean + [s for s in joining if joins[s] <= layer])
        return cls(rows, blocks, [None if low is None else s for s, low in enumerate(lowest)])

    def entering(self, layer: int) -> list[int | None]:
        """The blocks reaching ``layer`` from below (the embeddings give one clean block)."""
        return self.blocks[layer - 1] if layer else [CLEAN]

    def gather(self, layer: int) -> torch.Tensor | None:
        """Row indices [rows x blocks] taking the rows that reach ``layer`` to those it runs on (a
        joining set copies the clean rows); None where they are the same."""
        before, after = self.entering(layer), self.blocks[layer]
        if before == after:
            return None
        return torch.cat(
            [torch.arange(self.rows) + before.index(b if b in before else CLEAN) * self.rows for b in after]
        )

    def layer_masks(self, masks: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, [rows x blocks, heads]: each block's heads ablated there (``ablating``)."""
        n_heads = masks.shape[2]
        return [
            torch.stack(
                [torch.zeros(n_heads, dtype=torch.bool) if b is CLEAN else masks[b, layer] for b in blocks]
            ).repeat_interleave(self.rows, dim=0)
            for layer, blocks in enumerate(self.blocks)
        ]

    def by_set(self, top: torch.Tensor) -> torch.Tensor:
        """The last layer's rows [rows x blocks, ...] -> [k, rows, ...], head set by head set."""
        per_block = top.view(len(self.blocks[-1]), self.rows, *top.shape[1:])
        return per_block[[self.blocks[-1].index(b) for b in self.owner]]


@contextmanager
def joining_rows(layers: list, layout: StackLayout):
    """Make each decoder layer run on ``layout.blocks`` of rows: forward pre-hooks take the hidden
    states reaching a layer (its first argument) to the layer's blocks (``StackLayout.gather``), and
    repeat every other tensor argument with ``layout.rows`` rows once per block (per-row masks,
    positions and rotary tables, which the model passes to each layer afresh), so no architecture's
    layers are re-implemented. Tensors of one dimension (``cache_position`` [T]) are never per row,
    so they are left alone. The context lasts one forward pass; a tensor passed to every layer (the
    mask, the rotary tables) is repeated once per number of blocks."""
    rows = layout.rows
    repeated: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (id, copies) -> (tensor, repeat)

    def expand(value, copies: int):
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == rows and copies > 1:
            key = id(value), copies
            if key not in repeated:  # the pair keeps the tensor, so its id is not reused
                repeated[key] = value, value.repeat(copies, *[1] * (value.dim() - 1))
            return repeated[key][1]
        return tuple(expand(v, copies) for v in value) if isinstance(value, tuple) else value

    def make_hook(layer: int):
        gather, copies = layout.gather(layer), len(layout.blocks[layer])

        def take(hidden: torch.Tensor) -> torch.Tensor:
            return hidden if gather is None else hidden.index_select(0, gather.to(hidden.device))

        def hook(module, args, kwargs):
            if args:
                args = (take(args[0]), *expand(args[1:], copies))
            return args, {k: take(v) if k == "hidden_states" else expand(v, copies) for k, v in kwargs.items()}

        return hook

    handles = [
        layer.register_forward_pre_hook(make_hook(i), with_kwargs=True)
        for i, layer in enumerate(layers)
        if layout.blocks[i] != [CLEAN]
    ]
    with removed_after(handles):
        yield


@contextmanager
def last_position_only(layer, out_proj, attention):
    """Only the last position of the last decoder layer reaches the logits (``logits_to_keep=1``),
    so that layer attends from its last query alone (under the forward's keyword arguments it
    yields, ``capture.last_query_only``) and its output projection and MLP (``layer.mlp``, where it
    has one) run on that position alone. The residual additions broadcast [rows, 1, hidden] over
    [rows, T, hidden], so the layer's output is exact at T-1 (the rest is never read). Enter it after
    ``ablating``: hooks run in order, and ablation needs every position (mean ablation fills each
    from its own mean)."""

    def last(module, args):
        return (args[0][:, -1:], *args[1:])

    modules = [out_proj, *([layer.mlp] if isinstance(getattr(layer, "mlp", None), torch.nn.Module) else [])]
    handles = [m.register_forward_pre_hook(last) for m in modules]
    with removed_after(handles):
        yield capture.last_query_only(attention)


def stacked_logits(
    model,
    arch: capture.Architecture,
    tokens: torch.Tensor,
    masks: torch.Tensor,
    position_mean: torch.Tensor | None = None,
) -> torch.Tensor:
    """[k, b, V] logits at T-1 of the ``b`` sequences ``tokens`` [b, T] with each of the ``k`` head
    sets ``masks`` [k, layers, heads] ablated, in one forward pass (call it under inference mode).

    Each set joins the clean rows at its lowest ablated layer (``StackLayout``, ``joining_rows``),
    and the last layer's attention, output projection and MLP run at the last position alone
    (``last_position_only``). ``position_mean``: mean ablation's values (``ablating``)."""
    layout = StackLayout.of(masks, tokens.shape[0])
    layers = arch.decoder_layers
    device = next(model.parameters()).device
    with (
        joining_rows(layers, layout),
        ablating(arch, layout.layer_masks(masks), position_mean),
        last_position_only(layers[-1], arch.out_projs[-1], arch.attentions[-1]) as last_only,
    ):
        logits = model(tokens.to(device), logits_to_keep=1, use_cache=False, **last_only).logits[:, -1]
    return layout.by_set(logits)


@dataclass
class Ablated:
    """What ``run_ablation`` measured over the ``n`` sequences it used (the first ``n`` of the probe),
    for each head set in the order given."""

    scores: list[Metrics]  # per head set: mean metrics of B at T-1
    loss: Float[np.ndarray, "sets n"]  # per-sequence loss of B
    n: int


def run_ablation(
    model,
    arch: capture.Architecture,
    batch: ProbeBatch,
    head_sets: list[list[tuple[int, int]]],
    batch_size: int,
    position_mean: torch.Tensor | None = None,
    stop=None,
) -> Ablated:
    """Metrics of B at T-1 for each head set ablated, all sets sharing each pass (``stacked_logits``);
    each minibatch holds ``batch_size`` sequences. ``stop(loss)``, given the per-sequence losses so
    far ([head sets, sequences]) after every minibatch, the last included, may end the run there
    (adaptive ablation)."""
    masks = torch.stack([head_mask(heads, arch.n_layers, arch.n_heads) for heads in head_sets])
    k = len(head_sets)
    sums = torch.zeros(k, len(METRICS), dtype=torch.float64)
    losses: list[torch.Tensor] = []  # per minibatch, [k, b]: each head set's loss of B per sequence
    n = 0
    with torch.inference_mode():
        for start in tqdm(range(0, batch.n, batch_size), desc="ablate", unit="batch", leave=False):
            stop_at = min(start + batch_size, batch.n)
            b = stop_at - start
            logits = stacked_logits(model, arch, batch.tokens[start:stop_at], masks, position_mean)  # [k, b, V]
            target = batch.b[start:stop_at].to(logits.device)
            rows = metrics_per_sequence(logits.flatten(0, 1), target.repeat(k)).cpu().view(k, b, len(METRICS))
            sums += rows.sum(1)
            losses.append(rows[..., 0])
            n = stop_at
            if stop is not None and stop(torch.cat(losses, dim=1).numpy()):
                break
    means = (sums / n).tolist()
    return Ablated([Metrics.of(dict(zip(METRICS, m))) for m in means], torch.cat(losses, dim=1).numpy(), n)


class AdaptiveStop(verdict.SequentialStop):
    """``run_ablation``'s ``stop`` for ``ablate.sequences=adaptive`` (head set 0 the circuit, the
    rest its controls), over a probe of ``len(clean_loss)`` sequences: one verdict, the causal
    criterion's (``verdict``), watched on the schedule ``verdict.look_sizes`` (``min_sequences``,
    doubling, then the last sequence; ``verdict.SequentialStop``); the run stops once a look's
    interval excludes zero. ``last`` is the interval of the last look made."""

    def __init__(self, settings: AblateConfig, clean_loss: np.ndarray):
        super().__init__(settings.min_sequences, len(clean_loss), settings.confidence)
        self.causal_factor, self.clean_loss = settings.causal_factor, clean_loss

    def __call__(self, loss: np.ndarray) -> bool:
        """``loss`` [head sets, n]: the per-sequence losses so far. True: the verdict is decided."""
        criterion = {CAUSAL: lambda: criterion_values(self.clean_loss, loss, self.causal_factor)}
        return bool(self.look(loss.shape[1], criterion))

    @property
    def last(self) -> dict | None:
        return self.intervals.get(CAUSAL)


def criterion_values(clean_loss: np.ndarray, loss: np.ndarray, causal_factor: float) -> np.ndarray:
    """The causal criterion's two per-sequence branches (``verdict.branches``) over the sequences
    measured; ``loss`` [head sets, n]: the circuit's row first, then its controls'."""
    n = loss.shape[1]
    return verdict.branches(clean_loss[:n], loss[0], loss[1:], causal_factor)


@dataclass(frozen=True)
class CleanRun:
    """The clean model on the probe, from the probe pass: what ablation is measured against."""

    metrics: dict  # the metrics of B at T-1 (``METRICS``), means over sequences
    loss: Float[np.ndarray, " n"]  # per-sequence loss of B, in probe order


@dataclass(frozen=True)
class ScreenedCircuit:
    """The screen's induction circuit, as ablation reads it."""

    heads: list[tuple[int, int]]  # (layer, head) at or above the circuit threshold
    induction_sel: Float[np.ndarray, "layers heads"]  # every head's induction selectivity
    level: float  # the circuit threshold


def ablate(
    settings: AblateConfig,
    stats_settings: StatsConfig,
    subject: capture.Subject | None,
    screened: ScreenedCircuit,
    clean: CleanRun,
    position_mean: torch.Tensor | None,
) -> AblationResult:
    """The ablation step: clean vs the ``screened`` circuit ablated vs its controls.

    ``settings`` is the run's ``AblateConfig``; with ``settings.heads`` set, those heads
    (validated against the model's shape before the probe pass) replace the screened
    circuit. ``position_mean`` (mean ablation) comes from the probe pass's capture;
    ``stats_settings`` (the run's ``StatsConfig``) sizes the effect's paired bootstrap. No control
    holds a head whose induction selectivity (``screened.induction_sel``) reaches
    ``settings.control_exclude`` x ``screened.level`` (the circuit threshold). With
    ``settings.sequences == "adaptive"`` the run stops once the verdict is decided; the
    metrics are then means over the sequences used, and the effect is against the clean
    loss of the same sequences."""
    clean_metrics, clean_loss = clean.metrics, clean.loss
    circuit = screened.heads
    result = AblationResult(
        enabled=settings.enabled,
        mode=settings.mode,
        causal_factor=settings.causal_factor,
        sequences=settings.sequences,
        clean=Metrics.of(clean_metrics),
    )
    if settings.heads is not None:  # the user's head set instead of the screened circuit
        circuit = [head_of(h) for h in settings.heads]  # checked before the probe pass
        result.heads = list(settings.heads)
    if not settings.enabled:
        return result
    if not circuit:
        result.note = "empty induction circuit: nothing to ablate"
        return result
    assert subject is not None  # the model loads where ablation runs (cache.needs_weights)
    model, arch, batch, batch_size = subject.model, subject.arch, subject.batch, subject.batch_size
    level = settings.control_exclude * screened.level
    set_aside = set_aside_heads(screened.induction_sel, level, circuit)
    drawn = draw_controls(circuit, arch.n_layers, arch.n_heads, settings.n_controls, settings.seed, set_aside)
    controls = drawn.sets
    result.control_draw = ControlDraw(
        asked=settings.n_controls,
        in_layer=drawn.in_layer,
        fallback=len(controls) - drawn.in_layer,
        fallback_layers={f"L{c}": f"L{f}" for c, f in sorted(drawn.fallback_layers.items())},
        set_aside_level=level,
        set_aside=[head_name(*h) for h in set_aside],
        note=drawn.note(settings.n_controls),
    )
    head_sets = [circuit, *controls]
    # Rows above the shared prefix are len(head_sets) x the sequences: as many as a clean pass of batch_size.
    per_pass = max(1, batch_size // len(head_sets))
    stop = AdaptiveStop(settings, clean_loss) if settings.sequences == "adaptive" and controls else None
    run = run_ablation(model, arch, batch, head_sets, per_pass, position_mean, stop)
    # Over the whole probe, the probe pass's own mean (today's numbers exactly); else the same sequences' mean.
    clean_used = clean_metrics["loss"] if run.n == batch.n else float(clean_loss[: run.n].mean())
    result.circuit = run.scores[0]
    result.controls = [
        ControlSet([head_name(*h) for h in heads], scores, "in-layer" if i < drawn.in_layer else "fallback")
        for i, (heads, scores) in enumerate(zip(controls, run.scores[1:]))
    ]
    result.effect = effect(
        clean_used, result.circuit.loss, [c.metrics.loss for c in result.controls], settings.causal_factor
    )
    result.sequences_used = run.n
    result.stopped_early = run.n < batch.n
    result.clean_loss_used = clean_used
    if controls:
        # The effect's paired bootstrap over the sequences used; then the criterion's interval: the
        # adaptive run's last look (the decisive one, or the one at the last sequence), or one
        # interval over every sequence.
        result.effect.intervals = stats.effect_intervals(
            clean_loss[: run.n], run.loss[0], run.loss[1:], settings.causal_factor, stats_settings
        )
        result.interval = (
            stop.last
            if stop is not None
            else verdict.interval(criterion_values(clean_loss, run.loss, settings.causal_factor), settings.confidence)
        )
    if not controls:
        result.note = result.control_draw.note
    elif result.effect.ratio is None:
        result.note = (
            f"the controls did not raise the loss of B "
            f"(mean {result.effect.controls_loss_increase_mean:+.4f}): no ratio"
        )
    return result
