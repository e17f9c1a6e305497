"""A toy checkpoint's copy loss drop, as its training measured it (``toy.train.measure_copy_loss_drop``).

The toys' training measures copying at every checkpoint it saves: the mean loss on the first copy of a
random span minus on its second copy (nats, on a fixed batch of 64 spans; about 0 without in-context
copying, large once induction heads copy), and keeps it in the panel's manifest. Per run,
``copy_loss_drop``, read from there (``TrainingData.recorded``); None for models whose training the tool
does not know. The report's revisions table and per-revision figure show it (``RunColumn``). Runs before
the registry held it as summary.json ``copy_loss_drop`` (``legacy``).
"""

from __future__ import annotations

from emergence.measures.plugin import Measure, MeasureInput, MeasureResult, RunColumn

FIELD = "copy_loss_drop"


def recorded(inputs: MeasureInput) -> MeasureResult:
    data = inputs.training_data
    return MeasureResult({}, {FIELD: None if data is None else data.recorded.get(FIELD)})


def legacy(summary: dict) -> dict | None:
    """This measure's field from a summary.json of schemas 3 and 4 (``copy_loss_drop``; schema 2's ``icl_score``)."""
    value = summary.get(FIELD, summary.get("icl_score") if summary["schema_version"] == 2 else None)
    return None if value is None else {FIELD: value}


MEASURE = Measure(
    name="training_copy_loss",
    version=1,
    needs=frozenset({"data"}),
    columns=(),
    run_fields=(FIELD,),
    trajectories=(),
    compute=recorded,
    run_columns=(RunColumn(FIELD, "copy loss drop (nats)"),),
    legacy=legacy,
)
