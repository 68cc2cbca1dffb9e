"""Text from a bundle, a device or a file, made inert before any format shows it.

A model id, an output name, a runtime log line or a warning is data. Shown raw it can act:
a newline starts a forged line (`PASS (PASS 8) ... exit code 0` under a failing run), a
carriage return or terminal escape overwrites what came before, U+202E (right-to-left
override) and the other bidi controls reorder what a reader sees, and zero-width or
line-separator characters hide text or break it where no newline is visible. Every format
(console, Markdown, HTML, JUnit, GitHub annotations, plot labels, the HUD) passes such text
through `visible()` first, then applies its own markup escaping.

Made visible, as `\\xNN` / `\\uNNNN` / `\\UNNNNNNNN` escapes: every character of Unicode
categories Cc (C0 and C1 controls, DEL: newline and tab included), Cf (format characters:
bidi embeddings/overrides/isolates, LRM/RLM/ALM, zero-width space/joiners, BOM, soft hyphen,
...), Zl and Zp (line and paragraph separators) and Cs (lone surrogates, from undecodable
bytes); plus the noncharacters U+FFFE/U+FFFF (invalid in XML). Everything else is kept, so
names in any script still read as written.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_EXTRA = frozenset((0xFFFE, 0xFFFF))


def _escape(code: int) -> str:
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


@lru_cache(maxsize=4096)
def _hidden(char: str) -> bool:
    return unicodedata.category(char) in _CATEGORIES or ord(char) in _EXTRA


def visible(text: Any) -> str:
    """`text` (any value: str() of it) with control, format, separator and surrogate characters
    shown as escapes. Safe to put on one line of any output; markup escaping is the caller's."""
    s = "" if text is None else str(text)
    if s.isprintable():  # the common case: nothing hidden (isprintable is False for all of the above)
        return s
    return s.translate(_SHOWN)  # str.translate in C over a table filled as characters are met


class _Shown(dict):
    """code point -> what `visible` shows for it (itself, or its escape), computed once per character:
    a multi-line table of an LLM run's steps took 0.03 s character by character in Python."""

    def __missing__(self, code: int) -> int | str:
        shown: int | str = _escape(code) if _hidden(chr(code)) else code
        if len(self) < 65536:  # bounded: a text of every code point cannot grow it without end
            self[code] = shown
        return shown


_SHOWN = _Shown()


def one_line(text: Any, limit: int | None = None) -> str:
    """`visible(text)`, cut to `limit` characters with an ellipsis (None: whole)."""
    shown = visible(text)
    if limit is not None and len(shown) > limit:
        return shown[: max(limit - 1, 0)] + "…"
    return shown


_MD_SPECIAL = str.maketrans({ch: "\\" + ch for ch in "\\`*_{}[]<>()#+!|~"})


def markdown_text(text: Any) -> str:
    """Text from a bundle, a device or the user, inert in Markdown: controls (terminal escapes
    included) blanked, markup characters escaped."""
    return visible(text).translate(_MD_SPECIAL)
