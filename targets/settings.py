"""Strict target settings: a `[targets.<family>]` table + URL query + `--target-opt` -> a dataclass.

An unknown key is an error with a did-you-mean, never silently kept: a typo in a
lab's config must not run with defaults. Values are coerced by the field's type
(bool/int/float/str/Path/list/dict), so TOML values and `KEY=VALUE` strings work alike.
"""

from __future__ import annotations

import os
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, TypeVar

from bundlerun.bundles.errors import ConfigError

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    import difflib  # only for an unknown word's hint

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(section: str, keys: Iterable[str], known: Iterable[str]) -> None:
    """ConfigError naming the first unknown key, with a suggestion and the known ones."""
    known = sorted(set(known))
    for key in keys:
        if key not in known:
            raise ConfigError(f"[{section}]: unknown setting {key!r}{did_you_mean(key, known)}; "
                              f"known: {', '.join(known)}")


def coerce(section: str, key: str, value: Any, kind: Any) -> Any:
    """`value` as the annotated `kind` (Optional allowed)."""
    origin = typing.get_origin(kind)
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        if value is None or value == "":
            return None
        kind, origin = args[0], typing.get_origin(args[0])
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError("expected true or false")
        if kind is int:
            if isinstance(value, bool):
                raise ValueError("expected a whole number")
            return int(value)
        if kind is float:
            number = float(value)
            if number != number or number in (float("inf"), float("-inf")):
                raise ValueError("not a finite number")  # an infinite timeout overflows OS timers
            from bundlerun.bundles.limits import MAX_TIMEOUT_S  # optional: its failure to load is handled here

            if key.endswith(("timeout", "_s", "timeout_s")) and number > MAX_TIMEOUT_S:
                raise ValueError(f"more than {MAX_TIMEOUT_S:g} seconds (bundlerun's limit, docs/security.md)")
            return number
        if kind is Path:
            return Path(os.path.expanduser(str(value)))
        if kind is str:
            if isinstance(value, (dict, list)):
                raise ValueError("expected text")
            return str(value)
        if origin is list or kind is list:
            items = value.split(",") if isinstance(value, str) else list(value)
            inner = (typing.get_args(kind) or [str])[0]
            return [coerce(section, key, v, inner) for v in items if str(v) != ""]
        if origin is dict or kind is dict:
            if isinstance(value, str):
                return dict(item.split("=", 1) for item in value.split(",") if item)
            return {str(k): str(v) for k, v in dict(value).items()}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{section}] {key} = {value!r} is not valid ({exc})") from None
    return value


def parse_settings(cls: type[T], raw: dict[str, Any] | None, section: str) -> T:
    """Build the settings dataclass `cls` from `raw`; strict about keys and types.
    Dashes in keys are accepted for underscores."""
    assert is_dataclass(cls)
    raw = {str(k).replace("-", "_"): v for k, v in dict(raw or {}).items()}
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.init}
    check_keys(section, raw, known)
    kwargs = {k: coerce(section, k, v, hints[k]) for k, v in raw.items()}
    missing = [n for n, f in known.items() if n not in kwargs and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"[{section}]: missing setting(s) {', '.join(missing)}")
    settings = cls(**kwargs)
    check = getattr(settings, "validate", None)
    if callable(check):
        check()
    return settings
