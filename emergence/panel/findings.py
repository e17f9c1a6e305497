"""The five panel findings of docs/method.md section 7 (the records of ``records.py``), computed from a
Trajectory by pure functions.

Definitions (thresholds are arguments; the defaults are docs/method.md section 4's):
* BOS fraction: heads with first-token selectivity >= ``class_threshold`` / all heads.
* Induction heads: induction selectivity >= ``circuit_threshold``.
* F1: layers with no BOS head at any revision.
* F2: largest adjacent rise of the BOS fraction, its share of the total rise (the final
  fraction: a model starts from none at initialisation), monotonicity, shape
  ("abrupt" when the largest jump is at least half of the total rise).
* F3: first revision with >= 3 induction heads (onset) and with BOS fraction >= 10, 30,
  50, 70 %; gap ratio = tokens(BOS 50 %) / tokens(onset).
* F4: recall of the final induction circuit (heads >= circuit threshold at the last
  revision): share of its heads whose induction selectivity is >= the class threshold.
  First revisions with recall >= 1/3, 2/3, 1; also top-k recall (k = circuit size).
* Sinks two ways (``sinks_gu``, where the runs measured it): Gu et al.'s Sink_0, the share
  of (sequence, layer, head) whose key-0 importance exceeds ``sink_epsilon``, per revision
  and per layer, with F1-F3 recomputed under it and the places where it and the BOS
  fraction disagree.
* F5: per final circuit head, the first revision where PR reaches 2x its first-revision
  value and the first where induction selectivity reaches the circuit threshold; the
  lead is the ratio of their token counts.
* Task circuits (a trajectory of task runs): ``task_findings.py``; its emergence is the
  milestone ``task_<task>``.

Every milestone carries ``bracket_tokens`` (it happened after the revision before and by
its own), F3 the range of its gap ratio over the brackets; from run directories, a
bootstrap over sequences (``uncertainty.py``) adds intervals and, per milestone, the
probability of each revision being it; F2 then calls a rise abrupt only if its share
holds at the interval's lower bound.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TypeVar, overload

import numpy as np

from emergence import measures
from emergence.core.config import StatsConfig, ThresholdConfig
from emergence.panel.records import (
    F1,
    F3,
    F4,
    F5,
    BosShape,
    DtypeNote,
    HeadLead,
    IntervalSettings,
    Milestone,
    ModelFindings,
    NullFloor,
    NullRuleUse,
    PanelFindings,
    PrIntegralRanking,
    RevisionRow,
    SeedFamily,
    SeedSpread,
    Shape,
    SinkF1,
    SinkF3,
    SinkFindings,
    SinkRow,
    SinkShape,
    Thresholds,
)
from emergence.panel.runs import Checkpoint, Trajectory
from emergence.panel.task_findings import task_findings, task_reached
from emergence.panel.token_axis import token_axes
from emergence.panel.uncertainty import Replicates, bracket, first_crossing_probability, ratio_range, replicates
from emergence.recipe import sinks
from emergence.recipe.screen import CLASSES, DTYPE_RELATIVE_ERROR, class_thresholds, head_name, near_threshold
from emergence.recipe.stats import NULL_RULES, interval

INDUCTION = CLASSES.index("induction")
BOS = CLASSES.index("bos")
S = TypeVar("S", bound=Shape)  # F2's record: BosShape or SinkShape
ONSET_HEADS = 3
BOS_MILESTONES = (10, 30, 50, 70)
RECALL_MILESTONES = {"recall_33": Fraction(1, 3), "recall_67": Fraction(2, 3), "recall_100": Fraction(1)}
TOPK_RECALL_MILESTONE = Fraction(2, 3)
PR_RISE_FACTOR = 2.0
ABRUPT_SHARE = 0.5

# The milestones by finding, as the records name them.
F3_MILESTONES = ("induction_onset", *(f"bos_{pct}" for pct in BOS_MILESTONES))
F4_MILESTONES = (*RECALL_MILESTONES, "topk_recall_67")
SINK_MILESTONES = tuple(f"sink_{pct}" for pct in BOS_MILESTONES)
# Those defined by a threshold on selectivities, which a dtype's rounding can move (not top-k
# recall, a ranking, nor Sink_0's, a level of attention).
THRESHOLD_MILESTONES = (*F3_MILESTONES, *RECALL_MILESTONES)


# --- per revision: the quantities the milestones are defined on (pure) --------------------------


def at_level(fraction: np.ndarray, pct: int) -> np.ndarray:
    """Whether a share has reached ``pct`` percent; the tolerance keeps a share equal to the
    level (2 of 4 heads: 50 %) from falling below it by rounding."""
    return fraction >= pct / 100 - 1e-12


def bos_fractions(traj: Trajectory, class_threshold: float) -> np.ndarray:
    return (traj.sel[..., BOS] >= class_threshold).mean(axis=(1, 2))


def bos_per_layer(traj: Trajectory, class_threshold: float) -> np.ndarray:
    """[revisions, layers]: BOS heads in each layer."""
    return (traj.sel[..., BOS] >= class_threshold).sum(axis=2)


def induction_counts(traj: Trajectory, circuit_threshold: float) -> np.ndarray:
    return (traj.sel[..., INDUCTION] >= circuit_threshold).sum(axis=(1, 2))


def final_circuit(traj: Trajectory, circuit_threshold: float) -> list[tuple[int, int]]:
    final = traj.checkpoints[-1].sel[..., INDUCTION]
    return [(int(layer), int(head)) for layer, head in np.argwhere(final >= circuit_threshold)]


def recall(traj: Trajectory, class_threshold: float, circuit_threshold: float) -> tuple[list, list]:
    """(recall, top-k recall) per revision, as Fractions (None when the final circuit is empty)."""
    circuit = final_circuit(traj, circuit_threshold)
    if not circuit:
        return [None] * len(traj.checkpoints), [None] * len(traj.checkpoints)
    k = len(circuit)
    members = set(circuit)
    rec, topk = [], []
    for c in traj.checkpoints:
        ind = c.sel[..., INDUCTION]
        rec.append(Fraction(sum(ind[l, h] >= class_threshold for l, h in circuit), k))
        order = np.argsort(-ind, axis=None, kind="stable")[:k]
        top = {tuple(map(int, np.unravel_index(i, ind.shape))) for i in order}
        topk.append(Fraction(len(top & members), k))
    return rec, topk


def sink_fractions(traj: Trajectory, epsilon: float) -> np.ndarray | None:
    """Gu et al.'s Sink_0 share per revision, or None unless every revision measured key-0 importance
    (``Checkpoint.sink_values``)."""
    values = [v for c in traj.checkpoints if (v := c.sink_values()) is not None]
    if len(values) != len(traj.checkpoints):
        return None
    return np.array([(s > epsilon).mean() for s in values])


def _sink_values(c: Checkpoint) -> np.ndarray:
    """A checkpoint's key-0 importances [n, layers, heads], where every revision measured them
    (``sink_fractions`` is not None)."""
    values = c.sink_values()
    assert values is not None
    return values


def _spectral(c: Checkpoint) -> np.ndarray:
    """A checkpoint's PR [layers, heads], where every revision has one (the callers check)."""
    assert c.spectral is not None
    return c.spectral


def _at_least(shares: list[Fraction | None], level: Fraction) -> np.ndarray:
    """Per revision, whether a recall (None: there is no final circuit) is at least ``level``."""
    return np.array([share is not None and share >= level for share in shares], dtype=bool)


def reached_by_revision(
    bos_fraction: np.ndarray,
    n_induction: np.ndarray,
    induction_recall: list,
    topk_recall: list,
    sink_fraction: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """Per milestone, whether each revision has reached it, [revisions] bool: F3's
    ``induction_onset`` and ``bos_<p>``, F4's ``recall_<p>`` and ``topk_recall_67``, and Gu et
    al.'s ``sink_<p>`` where measured (``sink_fraction`` not None). From the per-revision
    quantities (the recalls as ``recall`` gives them); a milestone is the first revision where
    this is true."""
    reached = {"induction_onset": n_induction >= ONSET_HEADS}
    reached.update({f"bos_{pct}": at_level(bos_fraction, pct) for pct in BOS_MILESTONES})
    reached.update({name: _at_least(induction_recall, level) for name, level in RECALL_MILESTONES.items()})
    reached["topk_recall_67"] = _at_least(topk_recall, TOPK_RECALL_MILESTONE)
    if sink_fraction is not None:
        reached.update({f"sink_{pct}": at_level(sink_fraction, pct) for pct in BOS_MILESTONES})
    return reached


def milestone_reached(
    traj: Trajectory,
    class_threshold: float,
    circuit_threshold: float,
    sink_epsilon: float = sinks.EPSILON,
) -> dict[str, np.ndarray]:
    """``reached_by_revision`` of a trajectory at these thresholds, and a task trajectory's emergence
    (``task_reached``)."""
    return {
        **reached_by_revision(
            bos_fractions(traj, class_threshold),
            induction_counts(traj, circuit_threshold),
            *recall(traj, class_threshold, circuit_threshold),
            sink_fractions(traj, sink_epsilon),
        ),
        **task_reached(traj),
    }


def replicates_reached(
    reps: Replicates, circuit: list[tuple[int, int]], class_threshold: float
) -> dict[str, np.ndarray]:
    """``reached_by_revision`` in every bootstrap replicate, [replicates, revisions] bool; recall's
    only where there is a final ``circuit``, and none for top-k recall."""
    reached = {"induction_onset": reps.n_induction >= ONSET_HEADS}
    reached.update({f"bos_{pct}": at_level(reps.bos_fraction, pct) for pct in BOS_MILESTONES})
    if circuit:
        # Recall of the final circuit in each replicate: the share of its heads above the class threshold.
        rep_recall = (np.stack([reps.induction_sel[:, :, l, h] for l, h in circuit], -1) >= class_threshold).mean(-1)
        reached.update({name: rep_recall >= float(level) - 1e-12 for name, level in RECALL_MILESTONES.items()})
    if reps.sink_fraction is not None:
        reached.update({f"sink_{pct}": at_level(reps.sink_fraction, pct) for pct in BOS_MILESTONES})
    return reached


def first_index(mask) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def milestone_at(
    traj: Trajectory,
    index: int | None,
    total_tokens: float | None = None,
    replicated: np.ndarray | None = None,
    near_threshold_heads: list[str] | None = None,
) -> Milestone | None:
    """The milestone first reached at revision ``index`` (None: never), with its bracket;
    ``total_tokens`` adds its share of training, ``replicated`` [replicates, revisions] (bool,
    from the bootstrap) the probability of each revision being the first crossing."""
    probability = (
        None if replicated is None else first_crossing_probability(replicated, [c.revision for c in traj.checkpoints])
    )
    if index is None:  # not reached; with a bootstrap, how likely each revision still is
        return None if probability is None else Milestone(None, None, None, probability=probability)
    c = traj.checkpoints[index]
    return Milestone(
        c.revision,
        c.tokens,
        bracket(traj.tokens, index),
        fraction_of_training=c.tokens / total_tokens if total_tokens else None,
        probability=probability,
        near_threshold_heads=near_threshold_heads,
    )


def near_threshold_at(rows: list[RevisionRow], index: int | None) -> list[str] | None:
    """The heads near a threshold at revision ``index`` or the one before (the milestone there
    could move by a revision); None when there are none, the dtypes are not known or ``index``
    is None."""
    if index is None:
        return None
    near = [r.near_threshold for r in rows[max(index - 1, 0) : index + 1] if r.near_threshold is not None]
    return sorted(set().union(*near)) or None


def gap(traj: Trajectory, later: int | None, earlier: int | None) -> tuple[float | None, list | None]:
    """F3's gap from the milestone at revision ``earlier`` to the one at ``later``: the ratio of
    their tokens, and its range over both brackets (``ratio_range``)."""
    ratio = (
        None if later is None or earlier is None else traj.checkpoints[later].tokens / traj.checkpoints[earlier].tokens
    )
    return ratio, ratio_range(later, earlier, traj.tokens, traj.tokens)


def _zero_layers(per_layer: np.ndarray) -> list[int]:
    """Layers whose [revisions, layers] count or share is zero at every revision."""
    return [int(l) for l in np.flatnonzero(per_layer.sum(0) == 0)]


# --- F2 and F5 ---------------------------------------------------------------------------------


@overload
def f2_shape(
    fractions: np.ndarray, revisions: list[str], replicated: np.ndarray | None = None, ci: float = StatsConfig.ci
) -> BosShape: ...
@overload
def f2_shape(
    fractions: np.ndarray,
    revisions: list[str],
    replicated: np.ndarray | None = None,
    ci: float = StatsConfig.ci,
    *,
    record: type[S],
) -> S: ...
def f2_shape(
    fractions: np.ndarray,
    revisions: list[str],
    replicated: np.ndarray | None = None,
    ci: float = StatsConfig.ci,
    record: type[Shape] = BosShape,
) -> Shape:
    """The shape of a sink fraction's rise (``record``: BosShape or SinkShape, which one); with its
    bootstrap replicates ``replicated`` [replicates, revisions], "abrupt" needs the share's lower
    bound >= 1/2."""
    jumps = np.diff(fractions)
    total_rise = float(fractions[-1])
    if len(jumps) == 0 or total_rise <= 0:  # nothing rose: no jump to speak of
        return record(
            largest_jump_pp=None,
            largest_jump=None,
            jump_share=None,
            monotonic=True,
            largest_drop_pp=None,
            shape=None,
            final_fraction=total_rise,
        )
    i = int(np.argmax(jumps))
    share = float(jumps[i] / total_rise)
    shape = "abrupt" if share >= ABRUPT_SHARE else "gradual"
    share_ci = final_ci = note = None
    if replicated is not None:
        final = replicated[:, -1]
        shares = (replicated[:, i + 1] - replicated[:, i]) / np.where(final > 0, final, np.nan)
        share_ci = interval(np.nan_to_num(shares, nan=0.0), ci)  # no final rise: no share
        final_ci = interval(final, ci)
        if shape == "abrupt" and share_ci[0] < ABRUPT_SHARE:
            shape = "gradual"
            note = (
                f"the largest rise is {share:.0%} of the total at the point estimate but "
                f"{share_ci[0]:.0%} at the lower bound of its interval: not called abrupt"
            )
    return record(
        largest_jump_pp=100 * float(jumps[i]),
        largest_jump=[revisions[i], revisions[i + 1]],
        jump_share=share,
        monotonic=bool((jumps >= 0).all()),
        largest_drop_pp=100 * float(min(0.0, jumps.min())),
        shape=shape,
        final_fraction=total_rise,
        jump_share_ci=share_ci,
        final_fraction_ci=final_ci,
        shape_note=note,
    )


def f5_leads(traj: Trajectory, circuit_threshold: float, reps: Replicates | None = None) -> F5:
    """F5 per head of the final circuit: where its PR rises, where its selectivity crosses the
    circuit threshold, and the lead between them."""
    heads = {}
    have_pr = all(c.spectral is not None for c in traj.checkpoints)
    for layer, head in final_circuit(traj, circuit_threshold):
        sel = traj.sel[:, layer, head, INDUCTION]
        cross = first_index(sel >= circuit_threshold)
        replicated = None if reps is None else reps.induction_sel[:, :, layer, head] >= circuit_threshold
        selectivity_cross = milestone_at(traj, cross, replicated=replicated)
        if not have_pr:
            heads[head_name(layer, head)] = HeadLead(
                selectivity_cross,
                pr_rise=None,
                lead=None,
                selectivity=sel.tolist(),
                pr=None,
                reason="no PR trajectory for this model",
            )
            continue
        pr = np.array([_spectral(c)[layer, head] for c in traj.checkpoints])
        rise = first_index(pr[1:] >= PR_RISE_FACTOR * pr[0])
        rise = None if rise is None else rise + 1  # a revision after the first
        lead = reason = None
        if rise is None:
            reason = (
                f"PR never reaches {PR_RISE_FACTOR:g}x its first-revision value "
                f"({pr[0]:.3g}): no measurable rise (already high at the first revision?)"
            )
        elif cross == 0:
            reason = "selectivity already above threshold at the first revision: no measurable lead"
        else:
            assert cross is not None  # a head of the final circuit crosses by the final revision
            lead = traj.checkpoints[cross].tokens / traj.checkpoints[rise].tokens
        heads[head_name(layer, head)] = HeadLead(
            selectivity_cross, milestone_at(traj, rise), lead, sel.tolist(), pr.tolist(), reason
        )
    return F5(heads, traj.spectral_estimator, PR_RISE_FACTOR)


def pr_integral_ranking(traj: Trajectory, class_threshold: float, top_k: int = 45) -> PrIntegralRanking | None:
    """Heads ranked by the integral of PR over log10(tokens) (trapezoid); the share of the
    top-k that the screen classifies (any class >= threshold) at the last revision."""
    if any(c.spectral is None for c in traj.checkpoints) or len(traj.checkpoints) < 2:
        return None
    pr = np.stack([_spectral(c) for c in traj.checkpoints])  # [revisions, layers, heads]
    x = np.log10(np.maximum(traj.tokens, 1.0))
    integral = ((pr[1:] + pr[:-1]) / 2 * np.diff(x)[:, None, None]).sum(0)
    k = min(top_k, integral.size)
    order = np.argsort(-integral, axis=None, kind="stable")[:k]
    top = [tuple(map(int, np.unravel_index(i, integral.shape))) for i in order]
    final = traj.checkpoints[-1].sel
    classified = [bool((final[l, h] >= class_threshold).any()) for l, h in top]
    induction = [final[l, h, INDUCTION] >= class_threshold for l, h in top]
    return PrIntegralRanking(
        top_k=k,
        heads=[head_name(l, h) for l, h in top],
        classified_share=float(np.mean(classified)),
        induction_share=float(np.mean(induction)),
    )


# --- sinks two ways ------------------------------------------------------------------------------


def second_sink_definition(
    traj: Trajectory,
    epsilon: float,
    fraction: np.ndarray,
    f3: SinkF3,
    reps: Replicates | None,
    bos: tuple[F1, BosShape, F3],
) -> SinkFindings:
    """Gu et al.'s Sink_0 (``emergence/recipe/sinks.py``) beside the BOS fraction: its trajectory
    (``fraction``, every revision having measured it), F1-F3 under it (``f3``: its milestones),
    and where the two definitions disagree (``bos``: the BOS fraction's F1-F3)."""
    per_layer = np.array(
        [(_sink_values(c) > epsilon).mean(axis=(0, 2)) for c in traj.checkpoints]
    )  # [revisions, layers]
    rep, ci = (None, StatsConfig.ci) if reps is None else (reps.sink_fraction, reps.ci)
    names = [c.revision for c in traj.checkpoints]
    rows = [
        SinkRow(
            c.revision,
            c.tokens,
            float(fraction[i]),
            per_layer[i].tolist(),
            None if rep is None else interval(rep[:, i], ci),
        )
        for i, c in enumerate(traj.checkpoints)
    ]
    f1 = SinkF1(zero_sink_layers=_zero_layers(per_layer))
    f2 = (
        f2_shape(fraction, names, record=SinkShape)
        if rep is None
        else f2_shape(fraction, names, rep, ci, record=SinkShape)
    )
    share = measures.sink_share()
    assert share is not None  # the checkpoints have its values
    return SinkFindings(
        epsilon=float(epsilon),
        definition=share.definition,
        revisions=rows,
        f1=f1,
        f2=f2,
        f3=f3,
        disagreements=definitions_disagree(*bos, f1, f2, f3),
    )


def definitions_disagree(
    bos_f1: F1, bos_f2: Shape, bos_f3: F3, sink_f1: SinkF1, sink_f2: Shape, sink_f3: SinkF3
) -> list[str]:
    """Where the BOS fraction's F1-F3 and Sink_0's tell different stories."""
    out = []
    if bos_f1.zero_bos_layers != sink_f1.zero_sink_layers:
        out.append(
            f"F1: layers without sinks at any revision are {bos_f1.zero_bos_layers or 'none'} by the BOS "
            f"fraction but {sink_f1.zero_sink_layers or 'none'} by Sink_0"
        )
    if bos_f2.shape != sink_f2.shape:
        out.append(
            f"F2: the rise is {bos_f2.shape or 'absent'} by the BOS fraction but {sink_f2.shape or 'absent'} by Sink_0"
        )
    for pct, by_bos, by_sink in zip(BOS_MILESTONES, bos_f3.bos_levels(), sink_f3.sink_levels()):
        at_bos, at_sink = (None if m is None else m.revision for m in (by_bos, by_sink))
        if at_bos != at_sink:
            out.append(
                f"F3: {pct}% is first reached at {at_bos or 'no revision'} by the BOS fraction but at "
                f"{at_sink or 'no revision'} by Sink_0"
            )
    return out


# --- what qualifies the findings -------------------------------------------------------------


def identical_weights(traj: Trajectory) -> list[list[str]]:
    """Groups of revisions whose weights fingerprints (``weights_sha256``) are equal: at most one
    of each group can be the checkpoint its name says (Pythia-2.8b, BLOOM and OLMo have served such)."""
    groups: dict[str, list[str]] = {}
    for c in traj.checkpoints:
        if c.weights_sha256:
            groups.setdefault(c.weights_sha256, []).append(c.revision)
    return [revisions for revisions in groups.values() if len(revisions) > 1]


def near_threshold_heads(c: Checkpoint, class_threshold: float, circuit_threshold: float) -> list[str] | None:
    """The heads of checkpoint ``c`` that its dtype's rounding could flip at these thresholds
    (``screen.near_threshold``); None when its dtype is not known."""
    if c.dtype not in DTYPE_RELATIVE_ERROR:
        return None
    near = near_threshold(c.sel, class_thresholds(class_threshold), circuit_threshold, DTYPE_RELATIVE_ERROR[c.dtype])
    return [head_name(l, h) for l, h in np.argwhere(near)]


def dtype_note(rows: list[RevisionRow]) -> DtypeNote | None:
    """The dtypes the revisions ran in against the study's (None: neither known)."""
    used = sorted({r.dtype for r in rows if r.dtype is not None})
    reference = sorted({r.reference_dtype for r in rows if r.reference_dtype is not None})
    if not used and not reference:
        return None
    return DtypeNote(
        dtypes=used,
        reference_dtype=reference[0] if len(reference) == 1 else None,
        differs=bool(reference) and used != reference,
        relative_error={d: DTYPE_RELATIVE_ERROR[d] for d in used if d in DTYPE_RELATIVE_ERROR},
    )


def null_floors(traj: Trajectory) -> NullFloor | None:
    """The null floors the runs report (``summary.json`` ``null``; the panel computes none): per
    rule its definition and revisions, the floors' range, and each set-aside head's revisions.
    None without runs' nulls (the reference study's data)."""
    nulls = {c.revision: c.null for c in traj.checkpoints if c.null is not None}
    if not nulls:
        return None
    rules: dict[str, list[str]] = {}
    set_aside: dict[str, list[str]] = {}
    for revision, null in nulls.items():
        rules.setdefault(null.rule, []).append(revision)
        for head in null.set_aside:
            set_aside.setdefault(head, []).append(revision)
    floors = [null.floor for null in nulls.values() if null.floor is not None]
    return NullFloor(
        rules={rule: NullRuleUse(NULL_RULES[rule], revisions) for rule, revisions in rules.items()},
        floor_range=[min(floors), max(floors)] if floors else None,
        set_aside=set_aside,
    )


# --- one model, the panel ----------------------------------------------------------------------


def model_findings(
    traj: Trajectory,
    class_threshold: float = ThresholdConfig.class_default,
    circuit_threshold: float = ThresholdConfig.circuit,
    reps: Replicates | None = None,
    sink_epsilon: float = sinks.EPSILON,
    refined: dict | None = None,
) -> ModelFindings:
    """F1-F5 of one trajectory, and the sink findings under Gu et al.'s definition where the runs
    measured it; ``reps`` (its bootstrap at these thresholds) adds the intervals; ``refined`` (the
    model's ``refined.json`` answers) is carried along."""
    names = [c.revision for c in traj.checkpoints]
    bos = bos_fractions(traj, class_threshold)
    per_layer = bos_per_layer(traj, class_threshold)
    n_ind = induction_counts(traj, circuit_threshold)
    rec, topk = recall(traj, class_threshold, circuit_threshold)
    sink = sink_fractions(traj, sink_epsilon)
    run_columns = measures.run_columns()
    rows = [
        RevisionRow(
            c.revision,
            c.tokens,
            float(bos[i]),
            per_layer[i].tolist(),
            int(n_ind[i]),
            induction_recall=None if rec[i] is None else float(rec[i]),
            topk_recall=None if topk[i] is None else float(topk[i]),
            refined=c.refined,
            near_threshold=near_threshold_heads(c, class_threshold, circuit_threshold),
            run_values={col.field: (c.measure_fields.get(name) or {}).get(col.field) for name, col in run_columns},
            weights_sha256=c.weights_sha256,
            dtype=c.dtype,
            reference_dtype=c.reference_dtype,
            null=c.null,
            bos_fraction_ci=None if reps is None else reps.interval(reps.bos_fraction[:, i]),
            n_induction_ci=None if reps is None else reps.interval(reps.n_induction[:, i]),
        )
        for i, c in enumerate(traj.checkpoints)
    ]
    circuit = final_circuit(traj, circuit_threshold)
    first = {name: first_index(hit) for name, hit in reached_by_revision(bos, n_ind, rec, topk, sink).items()}
    replicated = {} if reps is None else replicates_reached(reps, circuit, class_threshold)
    milestones = {
        name: milestone_at(
            traj,
            index,
            # F4 is about how early in training: its milestones state the share
            total_tokens=traj.checkpoints[-1].tokens if name in F4_MILESTONES else None,
            replicated=replicated.get(name),
            near_threshold_heads=(near_threshold_at(rows, index) if name in THRESHOLD_MILESTONES else None),
        )
        for name, index in first.items()
    }
    f1 = F1(zero_bos_layers=_zero_layers(per_layer))
    f2 = f2_shape(bos, names) if reps is None else f2_shape(bos, names, reps.bos_fraction, reps.ci)
    gap_ratio, gap_range = gap(traj, first["bos_50"], first["induction_onset"])
    f3 = F3(**{name: milestones[name] for name in F3_MILESTONES}, gap_ratio=gap_ratio, gap_ratio_range=gap_range)
    sinks_gu = None
    if sink is not None:
        gap_ratio, gap_range = gap(traj, first["sink_50"], first["induction_onset"])
        sink_f3 = SinkF3(
            **{name: milestones[name] for name in SINK_MILESTONES}, gap_ratio=gap_ratio, gap_ratio_range=gap_range
        )
        sinks_gu = second_sink_definition(traj, sink_epsilon, sink, sink_f3, reps, (f1, f2, f3))
    return ModelFindings(
        revisions=rows,
        f1=f1,
        f2=f2,
        f3=f3,
        sinks_gu=sinks_gu,
        f4=F4(
            **{name: milestones[name] for name in F4_MILESTONES}, final_circuit=[head_name(l, h) for l, h in circuit]
        ),
        f5=f5_leads(traj, circuit_threshold, reps),
        pr_integral_ranking=pr_integral_ranking(traj, class_threshold),
        intervals=reps is not None,
        identical_weights=identical_weights(traj),
        dtype=dtype_note(rows),
        null_floor=null_floors(traj),
        refined=refined,
        task=task_findings(traj, class_threshold),
        unit=traj.unit,
    )


SEED_MILESTONES = (*F3_MILESTONES, *RECALL_MILESTONES)  # the fields of SeedFamily


def across_seeds(trajectories: dict[str, Trajectory], models: dict[str, ModelFindings]) -> dict[str, SeedFamily]:
    """Per model trained from several seeds: each milestone's median and range over the seeds."""
    families: dict[str, list[str]] = {}
    for name, traj in trajectories.items():
        if traj.family is not None:
            families.setdefault(traj.family, []).append(name)
    out = {}
    for family, names in families.items():
        spreads = {}
        for milestone in SEED_MILESTONES:
            reached_at = {n: models[n].milestones()[milestone] for n in names}
            tokens = {n: None if m is None else m.tokens for n, m in reached_at.items()}
            reached = [t for t in tokens.values() if t is not None]
            spreads[milestone] = SeedSpread(
                per_seed=tokens,
                reached=len(reached),
                median=float(np.median(reached)) if reached else None,
                range=[min(reached), max(reached)] if reached else None,
            )
        out[family] = SeedFamily(seeds=names, **spreads)
    return out


def panel_findings(
    trajectories: dict[str, Trajectory],
    class_threshold: float = ThresholdConfig.class_default,
    circuit_threshold: float = ThresholdConfig.circuit,
    intervals: bool = True,
    sink_epsilon: float = sinks.EPSILON,
    refined: dict[str, dict] | None = None,
) -> PanelFindings:
    """F1-F5 per trajectory (with the bootstrap where run directories allow it) and across seeds;
    ``refined``: the milestones ``python -m emergence.refine`` narrowed, per model."""
    models = {
        m: model_findings(
            t,
            class_threshold,
            circuit_threshold,
            replicates(t, class_threshold, circuit_threshold, sink_epsilon) if intervals else None,
            sink_epsilon,
            (refined or {}).get(m),
        )
        for m, t in trajectories.items()
    }
    return PanelFindings(
        thresholds=Thresholds(class_=class_threshold, circuit=circuit_threshold, sink_epsilon=sink_epsilon),
        intervals=IntervalSettings(
            n_boot=StatsConfig.n_boot,
            ci=StatsConfig.ci,
            seed=StatsConfig.seed,
            method="percentile bootstrap over sequences, one resample matrix for all revisions",
        ),
        models=models,
        seeds=across_seeds(trajectories, models),
        token_axis=token_axes(trajectories, models),
    )
