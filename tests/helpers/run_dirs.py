"""Summaries for run directories the report tests write by hand (``test_report.write_checkpoint``)."""

from emergence.recipe.ablation import AblationResult, Metrics
from emergence.run.results import (
    SCHEMA_VERSION,
    Download,
    NearThreshold,
    ProbeSummary,
    RunSummary,
    SpectralSummary,
    Thresholds,
)


def run_summary(**fields) -> RunSummary:
    """A ``RunSummary`` with ``fields`` (at least model, revision, tokens, n_layers, n_heads) and
    neutral values elsewhere: no thresholds of its own, nothing near one, ablation off, the probe's
    settings unknown (OmegaConf's ``???``), no null, sink metric or intervals."""
    return RunSummary(
        **{
            "schema_version": SCHEMA_VERSION,
            "name_or_path": "hand-made",
            "training_seed": None,
            "step": None,
            "architecture": "hand-made",
            "head_dim": 8,
            "dtype": "float32",
            "reference_dtype": None,
            "near_threshold": NearThreshold(5e-5, 0, []),
            "device": "cpu",
            "weight_bytes": 0,
            "weights_sha256": None,
            "download": Download(0, 0.0, False, 0.0),
            "batch_size": 4,
            "probe": ProbeSummary(fingerprint="hand-made", baseline_positions=[]),
            "thresholds": Thresholds({}, 50.0),
            "class_counts": {},
            "member_counts": {},
            "bos_fraction": 0.0,
            "bos_fraction_ci": [0.0, 0.0],
            "bos_per_layer": [],
            "induction_circuit": [],
            "intervals": None,
            "null": None,
            "threshold_warnings": [],
            "spectral": SpectralSummary(n_sequences=4),
            "reused_measurements": False,
            "ablation": AblationResult(False, "zero", 3.0, "adaptive", Metrics(0.0, 0.0, 0.0, 0.0)),
            "config_digest": "hand-made",
            "timings": {},
            "versions": {},
            **fields,
        }
    )
