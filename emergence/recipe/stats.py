"""Uncertainty from the one probe pass (docs/method.md section 9), pure numpy.

* A bootstrap over sequences: one seeded matrix of resampling weights ``[n_boot, n]``
  (multinomial counts / n) times the per-sequence attentions ``[n, layers, heads, 7]``
  gives every replicate's batch means in one matrix product; numerator and baseline come
  from the same resample (paired), and the screen is recomputed in each replicate.
* The reference study's null: the target replaced by a random non-special position, drawn
  with its generator draw for draw; the capture sums the attention to those positions
  (``capture.Recorder``), and ``null_calibration`` turns the sums into the floor below
  which a threshold cannot tell a head from chance. Which heads' draws make the floor is
  the rule (``NULL_RULES``): the reference pools every head; ``nondegenerate`` sets aside
  the heads whose baseline attention is degenerate (``degenerate_baseline``), whose null
  selectivities are ratios of two near-zero attentions and, pooled, would set the floor alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from jaxtyping import Bool, Float

from emergence.core.config import StatsConfig
from emergence.core.record import Record
from emergence.recipe.probe import LOCAL_OFFSETS
from emergence.recipe.screen import (
    BASELINE,
    CLASSES,
    MIN_BASELINE,
    UNCLASSIFIED,
    HeadClasses,
    Screened,
    classify,
    head_name,
    selectivity,
)

log = logging.getLogger(__name__)

NULL_SEED = 2026  # the reference calibration's generator
NULL_FLOOR_MIN = 2.0  # floor = max(2, pooled null p99)
# Below a thousandth of uniform attention (1/T) on the baseline positions, the T-1 row gives all
# ordinary positions together about 0.1% of its attention or less: the baseline, and every null
# draw, is the far tail of the softmax, and a ratio over it measures how far that tail lies, not
# where the head attends. On the toy panel the one head that becomes so sits at 1e-6 to 6e-4 of
# uniform with null p99s of 370x to 64,000x; every other head at every revision at 0.014 or more,
# with null p99s of 10.5x or less.
DEGENERATE_BASELINE_SHARE = 1e-3
NULL_RULES = {
    "nondegenerate": "floor = max(2, p99 of the null selectivities pooled over the draws of the heads whose "
    f"baseline attention is at least {DEGENERATE_BASELINE_SHARE:g}/T, T the probe's length (uniform "
    "attention is 1/T)); the heads below it are set aside, since their null selectivities are "
    "ratios of two near-zero attentions",
    "reference": "floor = max(2, p99 of the null selectivities pooled over every head x draw), the reference "
    "study's rule",
}


def resample_weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] float64: row b holds how often each sequence is drawn in replicate b, over n.

    The same (n, n_boot, seed) gives the same matrix, so replicates stay paired across the
    checkpoints of a panel."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot) / n


def replicate_means(per_sequence: np.ndarray, weights: np.ndarray, chunk: int = 256) -> np.ndarray:
    """[n, ...] per-sequence values, [B, n] weights -> [B, ...] resampled means (chunks of B bound memory)."""
    flat = per_sequence.reshape(per_sequence.shape[0], -1).astype(np.float64)
    out = np.empty((weights.shape[0], flat.shape[1]))
    for start in range(0, weights.shape[0], chunk):
        out[start : start + chunk] = weights[start : start + chunk] @ flat
    return out.reshape(weights.shape[0], *per_sequence.shape[1:])


def percentile_interval(replicates: np.ndarray, ci: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the first axis: (low, high) at ``ci`` (e.g. 0.95)."""
    tail = 100 * (1 - ci) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return low, high


def interval(replicates: np.ndarray, ci: float) -> list[float]:
    """The percentile interval of one quantity's replicates [B], as [low, high] for the JSON files."""
    low, high = percentile_interval(replicates, ci)
    return [float(low), float(high)]


def replicate_selectivity(targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[n, layers, heads, 7] per-sequence attentions -> [B, layers, heads, 6] selectivities."""
    return selectivity(replicate_means(targets, weights))


def null_positions(ab: np.ndarray, seq_len: int, n_draws: int, seed: int = NULL_SEED) -> np.ndarray:
    """[n_draws, n] random non-special key positions, the reference's draws in its order.

    For each draw (outer) and sequence (inner), ``RandomState(seed).randint(1, T-1)`` is drawn
    until it is none of 0, T-1, T-2, T-6..T-3, ab, ab+1. The stream is drawn in blocks (numpy
    gives the same values in a block as one at a time). The fixed special positions are
    rejected whatever slot a draw would fill, so they are dropped from a block at once; what
    remains is dealt out to the slots in order, 2T at a time, and only a draw equal to
    its own slot's ab or ab+1 (about one in T/2) is rejected there: the draws before it are
    kept, it is dropped, and dealing resumes with the next draw in the same slot."""
    ab = np.asarray(ab, dtype=np.int64)
    n, T = len(ab), seq_len
    special = np.zeros(T, dtype=bool)
    special[[0, T - 1, T - 2, *(T - o for o in LOCAL_OFFSETS)]] = True
    rng = np.random.RandomState(seed)
    slots = n_draws * n
    own = np.tile(ab, n_draws)  # the ab of the sequence each slot serves (draw-major, as the reference loops)
    out = np.empty(slots, dtype=np.int64)
    filled = 0
    while filled < slots:
        stream = rng.randint(1, T - 1, size=max(4096, (slots - filled) * 21 // 20))
        stream = stream[~special[stream]]
        while len(stream) and filled < slots:
            k = min(len(stream), slots - filled, 2 * T)  # about 4 rejections in a window: the fastest size
            bad = ((stream[:k] - own[filled : filled + k]) & ~1) == 0  # the difference is 0 or 1: ab or ab+1
            first = int(bad.argmax())
            if not bad[first]:  # no rejection in the window: keep all of it
                first = k
            out[filled : filled + first] = stream[:first]
            filled += first
            stream = stream[first + (first < k) :]  # drop the rejected draw itself
    return out.reshape(n_draws, n)


def degenerate_baseline(baseline_mean: np.ndarray, seq_len: int) -> np.ndarray:
    """[layers, heads] bool: the head's mean attention to the baseline positions is under
    ``DEGENERATE_BASELINE_SHARE`` of uniform attention over the ``seq_len`` keys of T-1."""
    return baseline_mean < DEGENERATE_BASELINE_SHARE / seq_len


@dataclass(frozen=True)
class NullCalibration:
    """The null's floor under one rule (``NULL_RULES``). The pooled numbers are over the draws of
    the heads the rule keeps; None (no floor) when it keeps none."""

    rule: str
    draws: int
    pooled_heads: int
    p95: float | None
    p99: float | None
    floor: float | None
    per_head_p99: Float[np.ndarray, "layers heads"]  # whatever the rule
    degenerate: Bool[np.ndarray, "layers heads"]  # bool (``degenerate_baseline``), whatever the rule
    degenerate_below: float  # the baseline attention under which a head is degenerate
    set_aside: dict[str, float]  # head name -> its baseline attention, for each head the rule set aside

    def as_summary(self) -> NullSummary:
        """``summary.json`` ``null``: the rule and what it pooled, set aside and gave."""
        return NullSummary(
            rule=self.rule,
            definition=NULL_RULES[self.rule],
            draws=self.draws,
            pooled_heads=self.pooled_heads,
            p95=self.p95,
            p99=self.p99,
            floor=self.floor,
            degenerate_below=self.degenerate_below,
            set_aside=self.set_aside,
        )


@dataclass
class NullSummary(Record):
    """``summary.json`` ``null``: the null calibration under one rule (``NULL_RULES``). Selectivities
    are multiples of the head's baseline attention; p95, p99 and floor are None when the rule kept
    no head."""

    rule: str
    definition: str  # the rule in words (``NULL_RULES``)
    draws: int  # random non-special positions drawn per head
    pooled_heads: int  # the heads whose draws are pooled
    p95: float | None  # pooled 95th percentile of the null selectivity
    p99: float | None
    floor: float | None  # max(2, p99): the selectivity chance reaches
    degenerate_below: float  # the baseline attention (a share of the query's attention) under which a head is set aside
    set_aside: dict[str, float]  # head name -> its baseline attention, for each head the rule set aside


def null_calibration(
    null_sums: np.ndarray, baseline_mean: np.ndarray, n: int, seq_len: int, rule: str
) -> NullCalibration:
    """The reference null from the capture's sums.

    ``null_sums`` [layers, heads, draws] (attention to each draw's positions, summed over the
    n sequences of ``seq_len`` tokens), ``baseline_mean`` [layers, heads] -> pooled p95 / p99
    over the heads ``rule`` keeps x draws, per-head p99 and ``floor = max(2, pooled p99)``."""
    null_sel = (null_sums / n) / np.maximum(baseline_mean, MIN_BASELINE)[..., None]
    degenerate = degenerate_baseline(baseline_mean, seq_len)
    set_aside = degenerate if rule == "nondegenerate" else np.zeros_like(degenerate)
    pooled = null_sel[~set_aside]  # [kept heads, draws]
    p95, p99 = (float(q) for q in np.percentile(pooled, [95, 99])) if pooled.size else (None, None)
    return NullCalibration(
        rule=rule,
        draws=int(null_sums.shape[-1]),
        pooled_heads=len(pooled),
        p95=p95,
        p99=p99,
        floor=None if p99 is None else max(NULL_FLOOR_MIN, p99),
        per_head_p99=np.percentile(null_sel, 99, axis=-1),
        degenerate=degenerate,
        degenerate_below=DEGENERATE_BASELINE_SHARE / seq_len,
        set_aside={head_name(l, h): float(baseline_mean[l, h]) for l, h in np.argwhere(set_aside)},
    )


def below_floor(
    scr: HeadClasses, class_thresholds: np.ndarray, circuit_threshold: float, floor: float | None
) -> list[str]:
    """The class thresholds ([6], order ``CLASSES``) and the circuit threshold below the null's
    floor that admit a head the floor would not (a member, or a circuit head, whose selectivity
    is under the floor): each named with those heads and their selectivities (a warning, not an
    error). A threshold below the floor that admits no such head changes nothing in this screen
    and is not named."""
    if floor is None:
        return []
    induction = CLASSES.index("induction")
    checks = [
        (name, value, scr.members[..., i], scr.sel[..., i])
        for i, (name, value) in enumerate(zip(CLASSES, class_thresholds))
    ]
    checks.append(("circuit", circuit_threshold, scr.induction_circuit, scr.sel[..., induction]))
    out = []
    for name, value, admitted, sel in checks:
        under = np.argwhere(admitted & (sel < floor))  # empty unless the threshold is under the floor
        if len(under):
            heads = ", ".join(f"{head_name(l, h)} ({sel[l, h]:.3g}x)" for l, h in under)
            out.append(f"{name}={value:g}x admits {heads}")
    return out


@dataclass(frozen=True)
class ScreenIntervals:
    """The screen's uncertainty over sequences. Per-head arrays are [layers, heads, 6]."""

    sel_low: Float[np.ndarray, "layers heads 6"]
    sel_high: Float[np.ndarray, "layers heads 6"]
    p_member: Float[np.ndarray, "layers heads 6"]  # share of replicates in which the head passes its class threshold
    bos_fraction: list[float]  # [low, high]
    circuit_size: list[float]
    class_counts: dict[str, list[float]]  # single label, unclassified included
    member_counts: dict[str, list[float]]


def screen_intervals(
    targets: np.ndarray, thresholds: np.ndarray, circuit_threshold: float, settings: StatsConfig
) -> ScreenIntervals:
    """Bootstrap the screen: resample sequences, recompute selectivities (paired numerator and
    baseline) and the whole classification in every replicate, take percentile intervals.
    ``settings``: the run's ``StatsConfig`` (n_boot, ci, seed)."""
    ci = settings.ci
    weights = resample_weights(targets.shape[0], settings.n_boot, settings.seed)
    sel = replicate_selectivity(targets, weights)  # [B, layers, heads, 6]
    rep = classify(sel, thresholds, circuit_threshold)  # the screen is shape-agnostic over leading axes
    sel_low, sel_high = percentile_interval(sel, ci)
    heads = (1, 2)
    return ScreenIntervals(
        sel_low=sel_low,
        sel_high=sel_high,
        p_member=rep.members.mean(axis=0),
        bos_fraction=interval(rep.members[..., CLASSES.index("bos")].mean(axis=heads), ci),
        circuit_size=interval(rep.induction_circuit.sum(axis=heads), ci),
        class_counts={c: interval((rep.head_class == c).sum(axis=heads), ci) for c in (*CLASSES, UNCLASSIFIED)},
        member_counts={c: interval(rep.members[..., i].sum(axis=heads), ci) for i, c in enumerate(CLASSES)},
    )


def effect_intervals(
    clean: np.ndarray, circuit: np.ndarray, controls: np.ndarray, causal_factor: float, settings: StatsConfig
) -> dict:
    """Paired bootstrap intervals of the ablation effect over sequences.

    Per-sequence losses of B: ``clean`` [n], ``circuit`` [n] (circuit ablated), ``controls``
    [k, n] (each control set ablated). One resample of the sequences serves the
    circuit and the controls alike, so their comparison is paired. ``causal_margin`` is the
    circuit's rise minus ``causal_factor`` x the size of the controls' mean change (> 0:
    causal); ``p_causal`` the share of replicates in which it is positive."""
    weights = resample_weights(len(clean), settings.n_boot, settings.seed)
    rise = replicate_means(circuit - clean, weights)
    control = replicate_means(controls.mean(axis=0) - clean, weights)
    margin = rise - causal_factor * np.abs(control)
    ci = settings.ci
    return {
        "ci": ci,
        "circuit_loss_increase": interval(rise, ci),
        "controls_loss_increase_mean": interval(control, ci),
        "causal_margin": interval(margin, ci),
        "p_causal": float((margin > 0).mean()),
    }


@dataclass
class Uncertainty:
    """The screen's uncertainty, from the same pass."""

    intervals: ScreenIntervals  # the bootstrap over sequences
    null: NullCalibration  # the reference null's floor
    below_floor: list[str]  # thresholds under the null floor that admit heads


def quantify_uncertainty(
    measured, screened: Screened, circuit_threshold: float, settings: StatsConfig, seq_len: int
) -> Uncertainty:
    """The screen's uncertainty from the probe pass's ``measured`` (``pass_record.PassRecord``):
    a bootstrap over sequences and the null's floor (``settings``: the run's ``StatsConfig``); a
    warning names the heads a threshold below the floor admits."""
    intervals = screen_intervals(measured.targets, screened.thresholds, circuit_threshold, settings)
    null = null_calibration(
        measured.null_sums, measured.mean_attention[..., BASELINE], len(measured.targets), seq_len, settings.null_rule
    )
    low = below_floor(screened.classes, screened.thresholds, circuit_threshold, null.floor)
    if null.floor is None:
        log.warning(
            f"warning: no null floor: every head's baseline attention is degenerate (under "
            f"{null.degenerate_below:.3g} = {DEGENERATE_BASELINE_SHARE:g}/T)"
        )
    if low:
        log.warning(
            f"warning: thresholds below the null floor {null.floor:.2f}x admit heads not told apart "
            f"from chance: {'; '.join(low)}"
        )
    return Uncertainty(intervals, null, low)
