"""A JSON object read into a dataclass and written back as it was read.

Reports imported from suites, older versions or other tools carry `criteria`, `stats` and `failed`
objects with some fields absent and keys no record field holds. The typed record keeps the shape
of what it was read from (key order, unknown keys and their values, the same for nested records)
so that writing it back gives the same bytes; a record made here (no shape) writes its own dict.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Shape:
    """How one object was written: its keys in order, the values of keys no field holds, nested shapes."""

    keys: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    nested: dict[str, "Shape"] = field(default_factory=dict)


def read_shaped(cls: Any, data: dict[str, Any], nested: dict[str, Any] | None = None) -> tuple[Any, Shape]:
    """`cls` from the known keys of `data` (nested: {field: dataclass} for object-valued fields), and its Shape.
    A nested field given as anything but an object keeps its default; its value is kept as read.
    Raises TypeError when `data` lacks a field `cls` requires."""
    nested = nested or {}
    names = {f.name for f in fields(cls)}
    kw: dict[str, Any] = {}
    shapes: dict[str, Shape] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key in nested and isinstance(value, dict):
            kw[key], shapes[key] = read_shaped(nested[key], value)
        elif key in names and key not in nested:
            kw[key] = value
        else:  # no field holds it, or a nested record given as something else (null): kept as read
            extra[key] = value
    return cls(**kw), Shape(tuple(data), extra, shapes)


def field_default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def write_shaped(obj: Any, shape: Shape | None, own: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The dict of `obj`: `own(obj)` without a shape; with one, its keys in the order read (unknown keys
    with their values as read), then any field since set away from its default."""
    if shape is None:
        return own(obj)
    full = own(obj)
    out: dict[str, Any] = {}
    for key in shape.keys:
        if key in shape.extra:
            out[key] = shape.extra[key]
        elif key in shape.nested and is_dataclass(value := getattr(obj, key)):
            out[key] = write_shaped(value, shape.nested[key], lambda o: full[key])
        else:
            out[key] = full[key] if key in full else getattr(obj, key)
    for f in fields(obj):
        if f.name not in out and f.name in full and getattr(obj, f.name) != field_default(f):
            out[f.name] = full[f.name]
    return out
