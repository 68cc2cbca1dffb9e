"""The Python shown in README.md and docs/ imports what it says from where it says: bundlerun
installs as `bundlerun.bundles`, `bundlerun.targets`, `bundlerun.runner` (a bare `bundles.` or
`runner.` import works only inside this checkout, and tosa-tools ships a `runner` of its own).
Every `from bundlerun... import a, b` line is executed and each name must exist; the tolerance
snippet of docs/tolerances.md runs whole. No doubles."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+([\w, ]+?)\s*(?:#.*)?$", re.M)
BARE = re.compile(r"^\s*(?:from|import)\s+(bundles|targets|runner)(\.|\s)", re.M)


def _imports() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in DOCS:
        for m in IMPORT.finditer(doc.read_text()):
            if m.group(1).startswith("bundlerun"):
                found.append((doc.name, m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]))
    return found


def test_no_doc_imports_a_bare_top_level_package():
    bad = [(doc.name, m.group(0).strip()) for doc in DOCS for m in BARE.finditer(doc.read_text())]
    assert bad == []


@pytest.mark.parametrize("doc,module,names", _imports(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_documented_import_resolves(doc, module, names):
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n) and importlib.util.find_spec(f"{module}.{n}") is None]
    assert missing == [], f"{doc}: from {module} import {', '.join(missing)}"


def test_the_tolerance_snippet_runs():
    text = (ROOT / "docs" / "tolerances.md").read_text()
    block = text.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/tolerances.md", "exec"), {})
