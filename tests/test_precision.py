"""Precision: float64 means over sequences, the dtypes' measured error, heads a rounding could flip."""

import math

import numpy as np
import pytest

from emergence.cache import sequence_mean
from emergence.config import compose_config
from emergence.main import analyse
from emergence.results import PER_SEQUENCE_FILE, read_run
from emergence.screen import CLASSES, selectivity
from test_main import SMALL


def exact_mean(per_sequence: np.ndarray) -> np.ndarray:
    """[n, ...] -> [...] correctly rounded means (math.fsum), an accumulation independent of numpy's."""
    flat = per_sequence.reshape(per_sequence.shape[0], -1).astype(float)
    return np.array([math.fsum(column) / len(column) for column in flat.T]).reshape(per_sequence.shape[1:])


def test_sequence_mean_accumulates_in_float64():
    rng = np.random.default_rng(0)
    per_sequence = (rng.random((4000, 3, 7)) * 0.01).astype(np.float32)
    exact = exact_mean(per_sequence)
    assert sequence_mean(per_sequence).dtype == np.float64
    np.testing.assert_allclose(sequence_mean(per_sequence), exact, rtol=1e-12)
    # what it replaces: numpy's float32 mean over axis 0 adds one sequence at a time
    assert np.abs(per_sequence.mean(axis=0) / exact - 1).max() > 1e-6


@pytest.mark.parametrize("arch", ["gpt_neox", "olmo", "olmoe", "llama"])
def test_selectivities_equal_a_float64_computation_on_the_stored_attentions(arch, tiny_dirs, tmp_path):
    """heads.csv's selectivities and mean attentions vs the correctly rounded means of the stored
    float32 per-sequence attentions (per_sequence.npz), to 1e-6, over 500 sequences."""
    small = [o for o in SMALL if not o.startswith("probe.n_sequences")]
    analyse(compose_config(["model=local", f"model.name_or_path={tiny_dirs[arch]}", *small,
                            "probe.n_sequences=500", "stats.n_boot=100", "ablate.enabled=false"]), tmp_path)
    _, rows = read_run(tmp_path)
    with np.load(tmp_path / PER_SEQUENCE_FILE) as npz:
        targets = npz["targets"]
    assert targets.dtype == np.float32 and targets.shape[0] == 500
    mean = exact_mean(targets)
    sel = selectivity(mean)
    for r in rows:
        l, h = r["layer"], r["head"]
        np.testing.assert_allclose([r[f"sel_{c}"] for c in CLASSES], sel[l, h], rtol=1e-6)
        np.testing.assert_allclose([r[f"attn_{c}"] for c in CLASSES] + [r["attn_baseline"]], mean[l, h], rtol=1e-6)
