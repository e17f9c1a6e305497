"""The recipe inside a training: ``track`` (any loop), ``EmergenceCallback`` (transformers' ``Trainer``),
and ``python -m emergence.watch`` (a folder the training saves into) (docs/own-runs.md)."""

from emergence.integrations.track import track
from emergence.integrations.trainer import EmergenceCallback

__all__ = ["EmergenceCallback", "track"]
