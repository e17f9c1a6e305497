import numpy as np

from emergence.recipe.screen import BASELINE, CLASSES, UNCLASSIFIED, class_thresholds, classify, selectivity

IND, DUP, PREV, SELF, FIRST, LOCAL = range(6)


def attention(values: dict[int, float], baseline: float) -> np.ndarray:
    a = np.zeros(7)
    for k, v in values.items():
        a[k] = v
    a[BASELINE] = baseline
    return a


def hand_made():
    """2 layers x 3 heads with known answers."""
    att = np.zeros((2, 3, 7))
    att[0, 0] = attention({PREV: 0.9}, 0.001)  # previous-token 900x
    att[0, 1] = attention({IND: 0.02}, 0.001)  # induction 20x: below 30, unclassified
    att[0, 2] = attention({FIRST: 0.5}, 0.0)  # baseline 0 -> floor 1e-8
    att[1, 0] = attention({FIRST: 0.6, IND: 0.2}, 0.002)  # first 300x best, induction 100x member
    att[1, 1] = attention({IND: 0.3, FIRST: 0.05}, 0.001)  # induction 300x best, first 50x member
    att[1, 2] = attention({LOCAL: 0.04, SELF: 0.035}, 0.001)  # local 40x best, self 35x member
    return att


def test_selectivity_is_ratio_to_floored_baseline():
    sel = selectivity(hand_made())
    assert sel.shape == (2, 3, 6)
    np.testing.assert_allclose(sel[0, 0, PREV], 900)
    np.testing.assert_allclose(sel[0, 2, FIRST], 0.5 / 1e-8)
    np.testing.assert_allclose(sel[1, 0, IND], 100)


def test_classes_memberships_and_bos():
    scr = classify(selectivity(hand_made()), class_thresholds(30.0), circuit_threshold=50.0)
    assert scr.head_class.tolist() == [["previous_token", UNCLASSIFIED, "bos"], ["bos", "induction", "local"]]
    assert scr.best_class[0, 1] == "induction"  # best class even when unclassified
    # Membership is multi-label and differs from best class.
    assert scr.members[1, 0, IND] and scr.members[1, 1, FIRST] and scr.members[1, 2, SELF]
    assert not scr.members[0, 1, IND]
    # BOS fraction counts first-token members (3 heads: L0H2, L1H0, L1H1), not best class (2).
    assert scr.bos_per_layer() == [1, 2]
    assert scr.bos_fraction() == 3 / 6
    assert scr.circuit_names() == ["L1H0", "L1H1"]
    counts = scr.class_counts()
    assert counts["bos"] == 2 and counts[UNCLASSIFIED] == 1 and sum(counts.values()) == 6
    assert scr.member_counts()["induction"] == 2


def test_per_class_threshold_override():
    thresholds = class_thresholds(30.0, {"induction": 10.0})
    assert thresholds[CLASSES.index("induction")] == 10.0
    scr = classify(selectivity(hand_made()), thresholds, circuit_threshold=15.0)
    assert scr.head_class[0, 1] == "induction"
    assert "L0H1" in scr.circuit_names()


def test_unknown_override_class_is_rejected():
    try:
        class_thresholds(30.0, {"first_token": 5.0})  # the study's name for the class we call bos
    except ValueError as err:
        assert "first_token" in str(err)
    else:
        raise AssertionError("expected ValueError")


def test_an_exact_tie_goes_to_the_first_class_in_the_study_order():
    """The study's order: induction, previous-token, duplicate-token, first-token, self, local."""
    order = [IND, PREV, DUP, FIRST, SELF, LOCAL]
    att = np.zeros((1, len(order), 7))
    for head in range(len(order)):
        tied = order[head:]  # this head ties every class from ``order[head]`` on at 40x
        att[0, head] = attention({c: 0.04 for c in tied}, 0.001)
    scr = classify(selectivity(att), class_thresholds(30.0), circuit_threshold=50.0)
    assert scr.best_class[0].tolist() == [CLASSES[c] for c in order]
    assert scr.head_class[0].tolist() == [CLASSES[c] for c in order]
