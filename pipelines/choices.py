"""Turning a user's string (or the enum itself) into an enum member, with an error that names the argument."""
from __future__ import annotations

import enum
from typing import TypeVar

E = TypeVar("E", bound=enum.Enum)


def parse_enum(enum_type: type[E], name: str, value: object) -> E:
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[m.value for m in enum_type]}, got {value!r}") from None
