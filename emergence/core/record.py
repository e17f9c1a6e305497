"""Typed records that save themselves: one ``to_json`` and one ``from_json`` for every result.

A record is a dataclass whose fields are JSON values (numbers, strings, booleans, None, lists
and string-keyed dicts of them) or other records, possibly in a list, a dict or optional.
``to_json`` gives the plain JSON object (numpy scalars become Python numbers); ``from_json``
rebuilds the record, nested records included, from the field types. A record's field names are
its JSON keys, except where its class maps them (``JSON_NAMES``: ``class`` is a Python keyword).
A key missing from the JSON reads as the field's default, or None. Arrays are not records'
business: they go to ``.npz`` files beside the JSON.
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
        return to_json(self)

    @classmethod
    def from_json(cls: type[R], data: dict) -> R:
        return from_json(cls, data)


def _json_names(cls) -> dict[str, str]:
    return getattr(cls, "JSON_NAMES", {})


def to_json(value: Any) -> Any:
    """A record (and the lists and dicts of them it holds) as JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _json_names(type(value))
        return {names.get(f.name, f.name): to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): to_json(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def from_json(hint: Any, value: Any) -> Any:
    """``value`` read from JSON as the type ``hint`` names: records rebuilt (with their lists,
    dicts and ``X | None``), everything else as is."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # X | None
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return from_json(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [from_json(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {key: from_json(item, v) for key, v in value.items()}
    if dataclasses.is_dataclass(hint):
        names, hints = _json_names(hint), typing.get_type_hints(hint)
        fields = {}
        for f in dataclasses.fields(hint):
            key = names.get(f.name, f.name)
            if key in value:
                fields[f.name] = from_json(hints[f.name], value[key])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                fields[f.name] = None
        return typing.cast(Any, hint)(**fields)  # a record's class
    return value
