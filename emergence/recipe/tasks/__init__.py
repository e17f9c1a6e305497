"""The reference study's four task batches (IOI, greater-than, successor, variable binding) and
their matched-random controls."""

from typing import Literal

Task = Literal["ioi", "greater_than", "successor", "binding"]
TASKS: tuple[Task, ...] = ("ioi", "greater_than", "successor", "binding")
