"""Typed records that save themselves: one ``to_json`` and one ``from_json`` for every step's result.

A record is a dataclass whose fields are JSON values (numbers, strings, booleans, None, lists
and string-keyed dicts of them) or other records, possibly in a list or optional. ``to_json``
gives the plain JSON object (numpy scalars become Python numbers); ``from_json`` rebuilds the
record, nested records included, from the field types. Arrays are not records' business: they
go to ``.npz`` files beside the JSON.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

import numpy as np

R = TypeVar("R", bound="Record")


class Record:
    """Mixin for dataclasses: ``to_json`` / ``from_json`` (see the module docstring)."""

    def to_json(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls: type[R], data: dict) -> R:
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: _typed(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data})


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _typed(hint: Any, value: Any) -> Any:
    """``value`` (plain JSON) as the type ``hint`` names: records rebuilt, everything else as is."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[X] / X | None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _typed(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_typed(item, v) for v in value]
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_json(value)
    return value
