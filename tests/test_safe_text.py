"""runner/report/safe_text.py `visible`: what it shows of untrusted text, checked character by character
against the rule its docstring states (Unicode categories Cc, Cf, Zl, Zp, Cs and U+FFFE/U+FFFF escaped,
everything else kept), for single characters and for long mixed texts."""

from __future__ import annotations

import random
import unicodedata

from bundlerun.runner.report.safe_text import visible


def _rule(text: str) -> str:
    out = []
    for ch in text:
        code = ord(ch)
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs") or code in (0xFFFE, 0xFFFF):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def test_every_character_of_the_first_planes_and_samples_beyond():
    codes = list(range(0x3000)) + list(range(0xD7F0, 0xE010)) + list(range(0xFE00, 0x10000)) + [
        0x1F600, 0xE0001, 0x10FFFF, 0x1D173]
    for code in codes:
        ch = chr(code)
        assert visible(ch) == _rule(ch), hex(code)
        assert visible(f"a{ch}\n{ch}b") == _rule(f"a{ch}\n{ch}b"), hex(code)


def test_long_mixed_texts_and_non_strings():
    rng = random.Random(0)
    alphabet = [chr(i) for i in range(0x300)] + ["\u202e", "\u200b", "\u2028", "\ufeff", "\ud800", "字", "\U0001F600"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        assert visible(text) == _rule(text)
    table = "| step | 12.5 dB | tok 17 |\n" * 2000
    assert visible(table) == table.replace("\n", "\\x0a")
    assert visible(None) == "" and visible(12) == "12" and visible("plain text") == "plain text"
