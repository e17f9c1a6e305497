"""Step 2 - the selectivity screen (docs/method.md section 4), pure numpy.

Input: the batch-mean attention from the query position T-1 to each class's target
key position(s) and to the baseline positions, per head. Output: selectivities,
best class, class (best class if above its threshold), multi-label memberships,
the induction circuit and the BOS statistics. The class ``bos`` is attention to the first
position, whatever token it holds (no tokenizer of the panel prepends a BOS token): the
study's "first-token (BOS)" class; the tokenizer's BOS token there is ``probe.first_token=bos_token``.

Names: the step is ``screen_heads``, its record ``Screened``; ``classify`` is its maths, whose
answer is ``HeadClasses`` (docs/glossary.md, Names kept apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from jaxtyping import Bool, Float, Shaped

# The six target classes, in the order of the last axis of every per-class array.
CLASSES = ("induction", "duplicate_token", "previous_token", "self", "bos", "local")
# The reference study's class order, which decides the best class at an exact tie (its first
# class wins); CLASSES keeps the arrays' and files' column order.
TIE_ORDER = ("induction", "previous_token", "duplicate_token", "bos", "self", "local")
_TIE_COLUMNS = np.array([CLASSES.index(c) for c in TIE_ORDER])  # CLASSES index of each TIE_ORDER class
N_TARGETS = len(CLASSES) + 1  # the six classes, then the baseline
BASELINE = len(CLASSES)  # index of the baseline in a [..., N_TARGETS] array
UNCLASSIFIED = "unclassified"
MIN_BASELINE = 1e-8  # selectivity = attention / max(baseline, MIN_BASELINE): no division by zero
# How far the run's dtype can move a selectivity, relative (its float32 value as the truth):
# the largest error measured by ``python -m benchmarks.bench --only dtype`` (benchmarks/results/dtype_error_cpu.json:
# float16 4.8e-3, bfloat16 1.5e-2 over gpt_neox, olmo, olmoe, llama), rounded up; float16 also
# covers the 5.6e-3 seen on the real OLMo/OLMoE checkpoints, float32 the 5e-5 by which float32
# kernels (ours, the study's eager path) differ.
DTYPE_RELATIVE_ERROR = {"float32": 5e-5, "float16": 6e-3, "bfloat16": 2e-2}


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def parse_head_name(name: str) -> tuple[int, int] | None:
    """ "L4H7" -> (4, 7); anything else -> None."""
    m = re.fullmatch(r"L(\d+)H(\d+)", name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def head_of(name: str) -> tuple[int, int]:
    """ "L4H7" -> (4, 7), for a name already checked to be a head's (``parse_head_name``)."""
    head = parse_head_name(name)
    if head is None:
        raise ValueError(f"{name!r} is not a head name (L<layer>H<head>)")
    return head


def selectivity(mean_attention: np.ndarray) -> np.ndarray:
    """[..., 7] mean attention (six classes, then baseline) -> [..., 6] selectivity."""
    baseline = np.maximum(mean_attention[..., BASELINE], MIN_BASELINE)
    return mean_attention[..., :BASELINE] / baseline[..., None]


def class_thresholds(default: float, overrides: dict[str, float] | None = None) -> np.ndarray:
    """[6] threshold per class: ``default`` unless overridden by class name."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(CLASSES)
    if unknown:
        raise ValueError(f"unknown class in threshold overrides: {sorted(unknown)}; known: {list(CLASSES)}")
    return np.array([float(overrides.get(c, default)) for c in CLASSES])


@dataclass(frozen=True)
class HeadClasses:
    """``classify``'s answer for one checkpoint. Shapes: ``sel`` and ``members`` [layers, heads, 6]."""

    sel: Float[np.ndarray, "layers heads 6"]
    best_class: Shaped[np.ndarray, "layers heads"]  # str: the highest-selectivity class
    head_class: Shaped[np.ndarray, "layers heads"]  # str: best class if >= its threshold, else unclassified
    members: Bool[np.ndarray, "layers heads 6"]  # bool: selectivity >= the class threshold
    induction_circuit: Bool[np.ndarray, "layers heads"]  # bool: induction selectivity >= circuit threshold

    @property
    def n_layers(self) -> int:
        return self.sel.shape[0]

    @property
    def n_heads(self) -> int:
        return self.sel.shape[1]

    def circuit_heads(self) -> list[tuple[int, int]]:
        return [(int(layer), int(head)) for layer, head in np.argwhere(self.induction_circuit)]

    def circuit_names(self) -> list[str]:
        return [head_name(l, h) for l, h in self.circuit_heads()]

    def bos_members(self) -> np.ndarray:
        return self.members[..., CLASSES.index("bos")]

    def bos_fraction(self) -> float:
        """Heads that are first-token members (not best class) over all heads."""
        return float(self.bos_members().mean())

    def bos_per_layer(self) -> list[int]:
        return [int(x) for x in self.bos_members().sum(axis=1)]

    def class_counts(self) -> dict[str, int]:
        """Heads per assigned class (single label), unclassified included."""
        return {c: int((self.head_class == c).sum()) for c in (*CLASSES, UNCLASSIFIED)}

    def member_counts(self) -> dict[str, int]:
        """Heads per class membership (multi-label)."""
        return {c: int(self.members[..., i].sum()) for i, c in enumerate(CLASSES)}


def near_threshold(
    sel: np.ndarray, thresholds: np.ndarray, circuit_threshold: float, relative_error: float
) -> np.ndarray:
    """[..., 6] selectivities -> [...] bool: a rounding of ``relative_error`` could flip the head,
    i.e. some class's selectivity (its membership, and its class where it is the best) or the
    induction selectivity (the circuit) lies within ``relative_error`` of its threshold."""

    def near(values, threshold):
        return np.abs(values - threshold) <= relative_error * values

    induction = sel[..., CLASSES.index("induction")]
    return near(sel, thresholds).any(axis=-1) | near(induction, circuit_threshold)


def classify(sel: np.ndarray, thresholds: np.ndarray, circuit_threshold: float) -> HeadClasses:
    """Classify heads from their [layers, heads, 6] selectivities (any leading axes)."""
    best = _TIE_COLUMNS[np.argmax(sel[..., _TIE_COLUMNS], axis=-1)]  # argmax keeps the first of equal values
    best_sel = np.take_along_axis(sel, best[..., None], axis=-1)[..., 0]
    best_names = np.array(CLASSES, dtype=object)[best]
    above = best_sel >= thresholds[best]
    head_class = np.where(above, best_names, UNCLASSIFIED)
    return HeadClasses(
        sel=sel,
        best_class=best_names,
        head_class=head_class,
        members=sel >= thresholds,
        induction_circuit=sel[..., CLASSES.index("induction")] >= circuit_threshold,
    )


@dataclass
class Screened:
    """Step 2's record: the screen at the run's thresholds."""

    thresholds: Float[np.ndarray, " 6"]  # class thresholds (order ``CLASSES``)
    classes: HeadClasses
    near_threshold: Bool[np.ndarray, "layers heads"]  # bool: heads the dtype's rounding could flip


def screen_heads(thresholds, mean_attention: np.ndarray, dtype: str) -> Screened:
    """Step 2: selectivities, classes, memberships and the circuit at ``thresholds`` (the run's
    ``ThresholdConfig``) from the batch-mean attention [layers, heads, 7], and the heads the run's
    ``dtype`` ("float32", ...) could flip."""
    per_class = class_thresholds(thresholds.class_default, thresholds.per_class.overrides())
    classes = classify(selectivity(mean_attention), per_class, thresholds.circuit)
    return Screened(
        per_class, classes, near_threshold(classes.sel, per_class, thresholds.circuit, DTYPE_RELATIVE_ERROR[dtype])
    )
