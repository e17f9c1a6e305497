"""The panel report's findings as typed records: what ``findings.json`` holds, field by field.

``findings.py`` computes them, ``markdown.py`` and ``figures.py`` render them, and
``PanelFindings.to_json`` / ``from_json`` (``emergence.core.record``'s walk over the fields) write and
read ``findings.json``. A record's field names are the file's keys (``JSON_NAMES`` maps the few
that cannot be: ``class`` is a Python keyword, and one F2 record serves two sink definitions).

Units: *tokens* are training tokens; a *fraction* or *share* is in [0, 1]; *pp* are percentage
points; selectivities are multiples of the head's baseline. An interval (``*_ci``) is
[low, high] from the bootstrap over sequences, present only where run directories allow one.
A field that does not apply, or was not measured, is ``None``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from emergence.core.record import from_json, to_json
from emergence.recipe.stats import NullSummary
from emergence.recipe.tasks.ablation import ScreenSweep
from emergence.recipe.tasks.matched_random import SeedSweep
from emergence.recipe.tasks.metrics import MetricValue
from emergence.recipe.tasks.published import SweepSummary


@dataclass(frozen=True)
class Milestone:
    """The first revision at which a quantity reaches a level: it happened after the revision
    before it and by this one."""

    revision: str | None  # None: not reached; such a milestone is kept only to carry ``probability``
    tokens: float | None
    # [tokens of the revision before (None: this is the first revision), tokens]: when it happened, (low, high]
    bracket_tokens: list[float | None] | None
    fraction_of_training: float | None = None  # tokens / the last revision's tokens (F4's milestones)
    # The share of bootstrap replicates whose first crossing is each revision ("never": none); the
    # revisions with a share of 0 are left out. Run directories only.
    probability: dict[str, float] | None = None
    # Heads near a threshold (by the runs' dtypes) at this revision or the one before: a rounding of
    # them could move the milestone by a revision. None: none, or the dtypes are not known.
    near_threshold_heads: list[str] | None = None


@dataclass(frozen=True)
class RevisionRow:
    """One revision of one model at the report's thresholds, with what its run recorded about it."""

    revision: str
    tokens: float
    bos_fraction: float  # share of all heads that are BOS heads (first-token selectivity >= class threshold)
    bos_per_layer: list[int]  # BOS heads in each layer
    n_induction: int  # heads with induction selectivity >= the circuit threshold
    induction_recall: float | None  # share of the final circuit at >= the class threshold; None: no final circuit
    topk_recall: float | None  # share of the final circuit among the k most induction-selective heads (k: its size)
    refined: bool  # analysed by ``python -m emergence.refine``, not one of the panel's revisions
    near_threshold: list[str] | None  # heads its dtype's rounding could move across a threshold; None: dtype unknown
    # the measures' per-run numbers the report shows per revision (``measures.run_columns``), by field; None:
    # not measured (the toys' copy loss drop: other models)
    run_values: dict[str, float | None] = field(default_factory=dict)
    weights_sha256: str | None = None  # fingerprint of the weights the run loaded
    dtype: str | None = None  # the dtype the run computed in
    reference_dtype: str | None = None  # the dtype the reference study ran this model in
    null: NullSummary | None = None  # the run's null calibration, as its summary.json states it
    bos_fraction_ci: list[float] | None = None
    n_induction_ci: list[float] | None = None


@dataclass(frozen=True)
class F1:
    """F1, the layers with no BOS head."""

    zero_bos_layers: list[int]  # layers with no BOS head at any revision


@dataclass(frozen=True)
class Shape:
    """F2, the shape of a sink fraction's rise (a model starts from none at initialisation, so the
    total rise is the final fraction). Abrupt: the largest adjacent rise is at least half of it,
    and with a bootstrap also at the lower bound of its interval."""

    largest_jump_pp: float | None  # the largest rise between adjacent revisions, pp; None: nothing rose
    largest_jump: list[str] | None  # [revision before, revision after] that rise
    jump_share: float | None  # largest rise / total rise
    monotonic: bool  # no fall between adjacent revisions
    largest_drop_pp: float | None  # the largest fall between adjacent revisions (<= 0), pp
    shape: str | None  # "abrupt" | "gradual"; None: nothing rose
    final_fraction: float  # the fraction at the last revision: the total rise
    jump_share_ci: list[float] | None = None
    final_fraction_ci: list[float] | None = None
    shape_note: str | None = None  # why a rise abrupt at the point estimate is not called abrupt


class BosShape(Shape):
    """F2 of the BOS fraction."""

    JSON_NAMES = {"final_fraction": "final_bos_fraction", "final_fraction_ci": "final_bos_fraction_ci"}


class SinkShape(Shape):
    """F2 of Gu et al.'s Sink_0 share."""

    JSON_NAMES = {"final_fraction": "final_sink_fraction", "final_fraction_ci": "final_sink_fraction_ci"}


@dataclass(frozen=True)
class F3:
    """F3, the separation of induction onset from BOS emergence."""

    induction_onset: Milestone | None  # the first revision with >= 3 heads at the circuit threshold
    bos_10: Milestone | None  # BOS fraction >= 10 %, and so on
    bos_30: Milestone | None
    bos_50: Milestone | None
    bos_70: Milestone | None
    gap_ratio: float | None  # tokens(bos_50) / tokens(induction_onset); None: either not reached
    gap_ratio_range: list[float | None] | None  # the gap over both brackets; a None end is open

    def bos_levels(self) -> list[Milestone | None]:
        """bos_10, bos_30, bos_50, bos_70."""
        return [self.bos_10, self.bos_30, self.bos_50, self.bos_70]

    def milestones(self) -> dict[str, Milestone | None]:
        return {
            "induction_onset": self.induction_onset,
            "bos_10": self.bos_10,
            "bos_30": self.bos_30,
            "bos_50": self.bos_50,
            "bos_70": self.bos_70,
        }


@dataclass(frozen=True)
class F4:
    """F4, early convergence: the recall of the final induction circuit (its heads at the last
    revision) is the share of them at or above the class threshold."""

    recall_33: Milestone | None  # recall >= 1/3
    recall_67: Milestone | None  # recall >= 2/3
    recall_100: Milestone | None  # every head of the circuit
    topk_recall_67: Milestone | None  # top-k recall >= 2/3
    final_circuit: list[str]  # heads ("L4H4") at >= the circuit threshold at the last revision

    def milestones(self) -> dict[str, Milestone | None]:
        return {
            "recall_33": self.recall_33,
            "recall_67": self.recall_67,
            "recall_100": self.recall_100,
            "topk_recall_67": self.topk_recall_67,
        }


@dataclass(frozen=True)
class HeadLead:
    """F5 for one head of the final circuit: does its PR rise before its selectivity crosses?"""

    selectivity_cross: Milestone | None  # the first revision with induction selectivity >= the circuit threshold
    pr_rise: Milestone | None  # the first revision with PR >= rise_factor x its first-revision value
    lead: float | None  # tokens(selectivity_cross) / tokens(pr_rise); None: no measurable lead (``reason``)
    selectivity: list[float]  # induction selectivity per revision
    pr: list[float] | None  # PR per revision (the estimator ``F5.pr_estimator``); None: not measured
    reason: str | None  # why there is no lead


@dataclass(frozen=True)
class F5:
    """F5, PR leads selectivity, per head of the final circuit."""

    heads: dict[str, HeadLead]  # by head name ("L4H4")
    pr_estimator: str | None  # the spectral estimator PR is (run directories: ``--pr-estimator``); None: no PR
    rise_factor: float  # a PR rise: this many times its first-revision value


@dataclass(frozen=True)
class SinkRow:
    """One revision under Gu et al.'s definition."""

    revision: str
    tokens: float
    sink_fraction: float  # Sink_0: share of (sequence, layer, head) whose key-0 importance exceeds epsilon
    sink_per_layer: list[float]  # the same share within each layer
    sink_fraction_ci: list[float] | None = None


@dataclass(frozen=True)
class SinkF1:
    """F1 under Sink_0."""

    zero_sink_layers: list[int]  # layers with no sink at any revision


@dataclass(frozen=True)
class SinkF3:
    """F3's sink milestones under Sink_0, against the same induction onset."""

    sink_10: Milestone | None  # Sink_0 >= 10 %, and so on
    sink_30: Milestone | None
    sink_50: Milestone | None
    sink_70: Milestone | None
    gap_ratio: float | None  # tokens(sink_50) / tokens(induction onset)
    gap_ratio_range: list[float | None] | None

    def sink_levels(self) -> list[Milestone | None]:
        """sink_10, sink_30, sink_50, sink_70."""
        return [self.sink_10, self.sink_30, self.sink_50, self.sink_70]

    def milestones(self) -> dict[str, Milestone | None]:
        return {"sink_10": self.sink_10, "sink_30": self.sink_30, "sink_50": self.sink_50, "sink_70": self.sink_70}


@dataclass(frozen=True)
class SinkFindings:
    """Sinks under Gu et al.'s definition (``emergence/recipe/sinks.py``) beside the BOS fraction: F1-F3
    recomputed under it, and where the two definitions tell different stories."""

    epsilon: float  # key-0 importance above it makes a sink
    definition: str  # Sink_0, in words
    revisions: list[SinkRow]
    f1: SinkF1
    f2: SinkShape
    f3: SinkF3
    disagreements: list[str]  # each place the two definitions disagree, in words


@dataclass(frozen=True)
class PrIntegralRanking:
    """Heads ranked by the integral of PR over log10(tokens)."""

    top_k: int
    heads: list[str]  # the top k, highest first
    classified_share: float  # share of them in any class at the last revision
    induction_share: float  # share of them at >= the class threshold as induction heads


@dataclass(frozen=True)
class DtypeNote:
    """The dtypes the revisions ran in against the study's."""

    dtypes: list[str]  # the runs' dtypes
    reference_dtype: str | None  # the study's (None: not known, or not one)
    differs: bool
    relative_error: dict[str, float]  # per dtype, the most its rounding moves a selectivity (relative)


@dataclass(frozen=True)
class NullRuleUse:
    """One null rule and the revisions whose floor it made."""

    definition: str  # ``stats.NULL_RULES``
    revisions: list[str]


@dataclass(frozen=True)
class NullFloor:
    """The null floors the runs used (the report computes none)."""

    rules: dict[str, NullRuleUse]  # by rule name
    floor_range: list[float] | None  # [lowest, highest] floor (x baseline); None: no run has one
    set_aside: dict[str, list[str]]  # heads set aside for a degenerate baseline -> the revisions they were


# --- task circuits (docs/tasks.md): a trajectory of one task's runs ---------------------------------


@dataclass(frozen=True)
class EmergenceLevel:
    """One condition of a task's emergence: the low end of ``metric``'s interval is above ``level``."""

    metric: str  # a name of ``summary.json`` ``task.metrics``
    level: float  # in the metric's units (a share for top-1, nats for a logit difference)


@dataclass(frozen=True)
class CircuitOverlap:
    """The heads of one task screen that are also in another set of heads of the same revision, in
    the screen's rank order."""

    induction: list[str]  # in the run's own induction circuit (``task.circuits``, >= 50x)
    previous_token: list[str]  # in its previous-token circuit (>= 100x, best class)
    sink: list[str]  # BOS heads at the report's class threshold (first-token selectivity >= it)


@dataclass(frozen=True)
class TaskRevision:
    """One revision of a task's trajectory."""

    revision: str
    tokens: float
    metrics: dict[str, MetricValue]  # the task's capability metrics, each with its interval over prompts
    cleared: bool  # every emergence level is cleared by its metric's interval
    screens: dict[str, list[str]]  # screen -> its top-k heads, best first
    overlaps: dict[str, CircuitOverlap]  # per screen
    refined: bool  # analysed by ``python -m emergence.refine``, not one of the panel's revisions


@dataclass(frozen=True)
class HeadEntry:
    """One head of a screen's top-k at the final revision, and when it first entered the top-k."""

    head: str  # "L13H1"
    rank: int  # at the final revision, 1 = best
    entered: Milestone  # the first revision whose top-k holds it (it may leave and return later)


@dataclass(frozen=True)
class PublishedRow:
    """One published ablation condition's metric beside ours at the same model's final revision."""

    experiment: str  # the study's experiment (``published.Experiment``)
    condition: str  # its condition name (``published.ConditionName``)
    metric: str
    published: float
    published_heads: list[str]  # the heads the study ablated, in its spec order
    ours: str | None  # our condition's name (``task.ablation``); None: not run
    value: float | None  # ours; None: not run
    ci: list[float] | None
    heads: list[str] | None  # the heads we ablated
    valid: bool  # False: the published row is not what its name says (``why``): nothing to compare
    why: str | None


@dataclass(frozen=True)
class PublishedScreenHeads:
    """A published top-5 screen beside ours at the final revision."""

    screen: str  # our screen name
    published: list[str]
    ours: list[str]
    shared: list[str]  # heads in both, in our rank order


@dataclass(frozen=True)
class PublishedSweep:
    """The study's 10-seed matched-random summary beside ours for one screen."""

    screen: str
    published: SweepSummary
    ours: SeedSweep | None  # None: our run swept no seeds for that screen


@dataclass(frozen=True)
class PublishedComparison:
    """Our final numbers beside the study's (``published.json``) for one of its models."""

    study_model: str  # pythia | olmo | olmoe
    revision: str  # the study's final revision, which our last one is
    rows: list[PublishedRow]
    screens: list[PublishedScreenHeads]
    sweeps: list[PublishedSweep]

    def invalid(self) -> list[PublishedRow]:
        return [r for r in self.rows if not r.valid]


@dataclass(frozen=True)
class TaskFindings:
    """One model's trajectory of one task's runs (docs/tasks.md): its capability over training, when
    it emerges, when the final screen's heads entered their screen, how the screens overlap the
    capability circuits and sinks, the final screen-vs-random verdicts and the published numbers."""

    task: str  # ioi | greater_than | successor | binding
    levels: list[EmergenceLevel]  # emergence: every level cleared by its metric's interval
    ci_level: float | None  # the intervals' coverage (the runs' stats.ci); None: they differ between runs
    revisions: list[TaskRevision]
    emergence: Milestone | None  # the first revision clearing every level; None: none does
    first_entry: dict[str, list[HeadEntry]]  # per screen, its final top-k in rank order
    # the final revision's sweeps with their verdicts, as its run judged them (``ablation.screen_sweep``);
    # empty: its run did not ablate
    verdicts: list[ScreenSweep]
    published: PublishedComparison | None  # None: not one of the study's models at its final revision


@dataclass(frozen=True)
class ModelFindings:
    """F1-F5 of one model's trajectory, and what qualifies them."""

    revisions: list[RevisionRow]
    f1: F1
    f2: BosShape
    f3: F3
    sinks_gu: SinkFindings | None  # None: the runs did not measure key-0 importance (or the reference data)
    f4: F4
    f5: F5
    pr_integral_ranking: PrIntegralRanking | None  # None: no PR, or a single revision
    intervals: bool  # whether the bootstrap ran (run directories with per-sequence attentions)
    identical_weights: list[list[str]]  # groups of revisions with the same weights_sha256
    dtype: DtypeNote | None  # None: no dtype known
    null_floor: NullFloor | None  # None: no run stated its null (the reference data)
    # The milestones ``python -m emergence.refine`` narrowed, by name: its ``refined.json`` answers
    # (``emergence.refine.Refinement``) as that file holds them. None: not refined.
    refined: dict[str, dict] | None = None
    task: TaskFindings | None = None  # a trajectory of task runs (probe.task); None: none
    # what every ``tokens`` of this model counts: training tokens, or steps where its runs recorded no tokens
    unit: str = "tokens"
    f6: F6 | None = None  # the parameter-space half against these milestones; None: reports before it
    f7: F7 | None = None  # the learning coefficient's stages; None: no run measured a measure's series

    def milestones(self) -> dict[str, Milestone | None]:
        """Every named milestone: F3's, F4's and, where measured, Sink_0's and the task's emergence
        (``task_<task>``)."""
        return {
            **self.f3.milestones(),
            **self.f4.milestones(),
            **(self.sinks_gu.f3.milestones() if self.sinks_gu else {}),
            **({f"task_{self.task.task}": self.task.emergence} if self.task else {}),
        }


@dataclass(frozen=True)
class SeedSpread:
    """One milestone over the training seeds of one model."""

    per_seed: dict[str, float | None]  # tokens per seed's panel name; None: not reached
    reached: int  # seeds that reached it
    median: float | None  # tokens, over the seeds that reached it
    range: list[float] | None  # [fewest, most] tokens over them


@dataclass(frozen=True)
class SeedFamily:
    """A model trained from several seeds: each milestone's spread over them."""

    seeds: list[str]  # the seeds' panel names ("toy_neox-seed1")
    induction_onset: SeedSpread
    bos_10: SeedSpread
    bos_30: SeedSpread
    bos_50: SeedSpread
    bos_70: SeedSpread
    recall_33: SeedSpread
    recall_67: SeedSpread
    recall_100: SeedSpread

    def milestones(self) -> dict[str, SeedSpread]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seeds"}


@dataclass(frozen=True)
class Conclusion:
    """One conclusion of one model over the threshold grid (``sensitivity.CONCLUSIONS``)."""

    model: str
    conclusion: str  # in words
    key: str  # its name in ``sensitivity.CONCLUSIONS`` and sensitivity.csv
    holds_at_report_thresholds: bool
    share: float  # share of the grid where it holds
    holds_everywhere: bool
    flips: str  # where it changes along each axis through the report's thresholds; "none"


@dataclass(frozen=True)
class Thresholds:
    """The thresholds every finding is computed at."""

    class_: float  # class / BOS membership, x baseline
    circuit: float  # the induction circuit, x baseline
    sink_epsilon: float  # Gu et al.'s key-0 importance level

    JSON_NAMES = {"class_": "class"}


@dataclass(frozen=True)
class IntervalSettings:
    """The bootstrap behind every interval and probability."""

    n_boot: int
    ci: float  # coverage
    seed: int
    method: str


@dataclass(frozen=True)
class Transition:
    """One measure over one probe's panel of a model (``token_axis``): its value per revision, its
    largest change between adjacent revisions, and the first revision past half of that change."""

    measure: str  # a key of ``token_axis.drawn``: a measure's per-run or column trajectory
    probe: str  # the probe.kind it was measured on
    revisions: list[str]
    tokens: list[float]
    values: list[float | None]  # None: not measured at that revision
    largest_jump: list[str] | None  # [revision before, revision after]; None: fewer than two values
    jump: float | None  # the value after minus before (signed)
    half_way: Milestone | None  # the first revision past the midpoint of the largest jump


@dataclass(frozen=True)
class Separation:
    """The tokens between two events of one model (F3's gap, for any pair of measures)."""

    earlier: str  # "<measure> (<probe>)", the event reached first
    later: str
    gap_ratio: float | None  # tokens(later) / tokens(earlier); None: the earlier is at 0 tokens
    gap_ratio_range: list[float | None] | None  # over both brackets; a None end is open


@dataclass(frozen=True)
class SinkProbes:
    """Sinks at one revision on the random-token probe and on text: Sink_eps and the BOS fraction."""

    revision: str
    tokens: float
    sink_fraction: dict[str, float | None]  # by probe.kind
    bos_fraction: dict[str, float | None]
    disagree: bool  # one probe puts Sink_eps at >= 50 % and the other below


@dataclass(frozen=True)
class TokenAxis:
    """One model's measures on one token axis (docs/probes.md): each probe's milestones and the
    transitions of the scores the field times these circuits by, and how far apart they are."""

    probes: list[str]  # the probe.kind of each trajectory it reads
    transitions: list[Transition]
    events: dict[str, Milestone | None]  # "<event> (<probe>)": the milestones and the transitions' half-ways
    separations: list[Separation]  # every pair of reached events, earlier first
    sinks: list[SinkProbes]  # revisions both the synthetic and the text probe measured; empty: not both

    def disagreements(self) -> list[str]:
        return [s.revision for s in self.sinks if s.disagree]


@dataclass(frozen=True)
class PanelFindings:
    """The panel report: every model's findings at one pair of thresholds. ``findings.json``."""

    thresholds: Thresholds
    intervals: IntervalSettings
    models: dict[str, ModelFindings]
    seeds: dict[str, SeedFamily]  # by model key, for models trained from several seeds
    # the causal-threshold sweeps (``causal_threshold.load_sweeps``)
    causal_threshold: list[dict] = field(default_factory=list)
    sensitivity: list[Conclusion] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # file names, in the report's folder
    token_axis: dict[str, TokenAxis] = field(default_factory=dict)  # by model (and seed) with the mechanism measured
    # branches the sweeps' integrity check found defective (``integrity``): {repo: {branch: verdict}}
    defective_checkpoints: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict:
        """``findings.json``'s content."""
        return to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> PanelFindings:
        return from_json(cls, data)


@dataclass(frozen=True)
class EdgePhase:
    """A window of the spectral edge (``python -m emergence.edge``, the whole model's scope) placed on the
    panel's axis: its updates span [first, last] (tokens, or steps where the runs count steps)."""

    name: str  # r23_peak: where sigma_2/sigma_3 peaks; r23_collapse: the first window after it below 1.20
    first_step: int
    last_step: int
    first: float | None  # the window's first checkpoint on the panel's axis
    last: float | None  # its last
    r23: float | None


@dataclass(frozen=True)
class EdgeDistance:
    """A milestone's signed distance from an edge phase: milestone - the phase's last checkpoint (> 0: the
    milestone comes later), and its range over the milestone's bracket and the window's span."""

    phase: str
    milestone: str
    distance: float | None  # None: the milestone or the phase has no place on the axis
    range: list[float | None] | None  # [low, high]; a None end is open (a milestone at the first revision)


@dataclass(frozen=True)
class CrossingOrder:
    """F6 for one head of the final circuit and one crossing a measure declares (``measures.crossings()``):
    did the head's ``column`` reach ``level`` before, at or after its induction selectivity crossed the
    circuit threshold?"""

    column: str
    level: float
    crossing: Milestone | None  # the first revision with the column >= the level; None: never
    selectivity_cross: Milestone | None  # the first with induction selectivity >= the circuit threshold
    order: str | None  # "before", "at" or "after": the column's crossing against the selectivity's; None: one missing
    values: list[float | None]  # the column per revision (None: not measured)


@dataclass(frozen=True)
class EdgePoint:
    """One window of the whole model's edge, for the figure: at its last checkpoint."""

    position: float
    r12: float | None
    r23: float | None
    drift_speed: float


@dataclass(frozen=True)
class F6:
    """F6, the two halves on one axis: the spectral edge's phases (parameter space) against the
    activation milestones, and per final-circuit head each crossing a measure declares against its
    selectivity's."""

    edge: str | None  # the edge.json read; None: none beside the runs (no phases then)
    window: int | None  # its W
    phases: list[EdgePhase]  # r23_peak and r23_collapse where found
    distances: list[EdgeDistance]  # every phase against every milestone
    series: list[EdgePoint]  # the whole model's windows, in order
    heads: dict[str, list[CrossingOrder]]  # by head name, one per declared crossing the runs measured


@dataclass(frozen=True)
class StagePoint:
    """A measure's per-run series (``RunSeries``: the LLC) at one checkpoint."""

    revision: str
    tokens: float
    value: float | None  # None: not measured, or failed
    spread: float | None  # its std over independent chains
    failed: str | None  # why it is not reported (then left out of the stages); None: reported


@dataclass(frozen=True)
class StageBoundary:
    """Where the series' slope against log tokens changes class (falling, flat, rising; a step counts as a
    rise or fall where it exceeds ``F7.jump_multiple`` times its chains' spread): at a checkpoint,
    bracketed by the measured checkpoints around it."""

    revision: str
    tokens: float
    bracket_tokens: list[float]  # [the measured checkpoint before, the one after]
    before: str  # "rising", "flat" or "falling": the step into it
    after: str  # the step out of it
    distances: dict[str, float | None]  # milestone name -> its tokens minus the boundary's (> 0: later)
    touches: dict[str, bool]  # milestone name -> whether the milestone's bracket touches or overlaps this one


@dataclass(frozen=True)
class HeadStage:
    """F7 for one asked head: did its refined LLC rise before, at or after its induction selectivity crossed?"""

    rise: Milestone | None  # the first checkpoint after a step up over the multiple of its chains' spread
    selectivity_cross: Milestone | None  # the first with induction selectivity >= the circuit threshold
    order: str | None  # "before", "at" or "after"; None: one of them missing
    values: list[float | None]  # per revision


@dataclass(frozen=True)
class F7:
    """F7, stages without a probe: the boundaries of a measure's per-run series (the LLC) on the token axis,
    against the activation milestones and the edge's phases."""

    measure: str  # the measure whose series it is (``measures.series()``)
    label: str
    jump_multiple: float
    relative_step: float
    series: list[StagePoint]
    boundaries: list[StageBoundary]
    heads: dict[str, HeadStage]  # by head name; empty where no head was asked
