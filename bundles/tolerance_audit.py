"""A scanner of ExecuTorch's test sources for the lines that set a tolerance.

Why: the registry must hold what ExecuTorch's own tests use, and "what they use" is
not a list anyone can keep by hand (the pinned tree has some 1,600 such lines). This
module reads every Python file under the backends' test folders with `ast` and
reports each place that sets a number a comparison is judged by:

- a keyword argument `atol=`, `rtol=`, `qtol=`, `frobenius_threshold=`, `cosine_threshold=`,
  `sqnr_threshold=`, `sqnr=`, `max_mse_error=`, `min_cosine=`, `threshold_db=`, `tol=`;
- a parameter default with one of those names (`def run_method_and_compare_outputs(atol=1e-03)`);
- an assignment to such a name or attribute (`TestQNN.atol = 1e-1`, `atol, rtol = 1e-2, 1e-2`),
  and a module constant whose name says it is one (`_MHA_ATOL = ...`, `SNR_THRESHOLD_DB = ...`);
- a tolerance passed by position to `allclose` / `isclose` (rtol third, atol fourth);
- a dict literal with "atol"/"rtol" keys (per-dtype presets);
- a comparison or unittest assertion of an SQNR / SNR / cosine / MSE value against a number
  (`compute_error(a, b) > 20`, `assertGreaterEqual(sqnr, 35)`), and metric objects built with
  a number (`Sqnr(20)`, `CosineSimilarity(0.99)`).

A value that is only forwarded (`atol=atol` of a parameter) is no setting and is not counted.
`bundlerun tolerance audit` compares the sites with the citations in the registry data.

Over 500 lines on purpose: one AST scanner and the kinds of site listed above, which share its
visitor; the comparison with the registry is the command (runner/commands/tolerance.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from bundlerun.bundles.registry_schema import BUNDLERUN, entry_values, origins_of, parse_merged

TOL_NAMES = {
    "atol": "atol", "rtol": "rtol", "qtol": "qtol", "frobenius_threshold": "frobenius",
    "cosine_threshold": "cosine", "sqnr_threshold": "sqnr", "sqnr": "sqnr", "max_mse_error": "mse",
    "min_cosine": "cosine", "threshold_db": "sqnr", "tol": "tol",
}
_CONST_NAME = re.compile(r"(?i)(^|_)(atol|rtol|qtol|tol|tolerance|tolerances|sqnr|snr(_threshold)?(_db)?|cosine|mse)(_|$)")
_PRESET_KEY = re.compile(r"^(atol|rtol|qtol)(_\w+)?$")  # "atol", "atol_bfloat16"
_EPS_NAME = re.compile(r"(?i)^(fp16|bf16|half)_eps(ilon)?$")
_METRIC_CALL = re.compile(r"(?i)^(sqnr|snr|cosine\w*|cos_sim\w*)$")
_METRIC_WORD = re.compile(r"(?i)sqnr|snr|cos(ine)?_?sim|cosine|\bcos\b|mse|compute_error")
_CLOSE_FUNCS = {"allclose", "isclose"}
_ASSERT_CMP = {"assertGreater": ">", "assertGreaterEqual": ">=", "assertLess": "<", "assertLessEqual": "<="}

# Test folders of every backend (relative to the ExecuTorch root), plus the shared harness
# and the cross-backend suite. Third-party trees under a backend are never scanned.
SCAN_GLOBS = ("backends/test/harness", "backends/test/suite", "backends/*/test", "backends/*/tests",
              "backends/*/*/test", "backends/*/*/tests", "backends/*/*/*/tests", "backends/*/*/*/test")
SKIP_PARTS = {"third-party", "third_party", "__pycache__"}
# Not a backend: shared graph transforms (their tests compare a graph before and after a pass).
SKIP_DIRS = ("backends/transforms/",)

# Folder of a backend in ExecuTorch -> its registry name.
BACKEND_DIRS = (
    ("backends/test/harness", "harness"), ("backends/test/suite", "suite"), ("backends/test", "harness"),
    ("backends/apple/coreml", "coreml"), ("backends/apple/mps", "mps"), ("backends/apple/metal", "metal"),
    ("backends/apple/coreai", "coreai"), ("backends/cortex_m", "cortex-m"), ("backends/qualcomm", "qnn"),
)


def backend_of(path: str) -> str:
    """Registry backend name of an ExecuTorch path (`backends/qualcomm/...` -> qnn)."""
    for prefix, name in BACKEND_DIRS:
        if path == prefix or path.startswith(prefix + "/"):
            return name
    parts = path.split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "backends" else parts[0]


@dataclass(frozen=True)
class Site:
    """One place in the source that sets a number a comparison is judged by."""

    path: str  # relative to the ExecuTorch root
    line: int
    end_line: int
    kind: str  # atol | rtol | qtol | frobenius | cosine | sqnr | mse | tol
    values: tuple[Any, ...]  # each a float, or None (`frobenius_threshold=None`: the check is off)
    how: str  # keyword | default | assign | constant | positional | preset | compare
    context: str  # Class.function holding it
    text: str  # the source line, stripped

    @property
    def backend(self) -> str:
        return backend_of(self.path)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" + (f"-{self.end_line}" if self.end_line != self.line else "")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "end_line": self.end_line, "backend": self.backend,
                "kind": self.kind, "values": list(self.values), "how": self.how, "context": self.context,
                "text": self.text}


_UNRESOLVED = object()


def _number(node: ast.AST, consts: dict[str, Any]) -> Any:
    """A literal number (or None) the node stands for, else _UNRESOLVED."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return None
        if isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node.value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", node.value):
            return float(node.value)  # "1e-4": generated C++ op tests take the tolerance as text
        return _UNRESOLVED
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(node.operand, consts)
        if isinstance(v, float):
            return -v if isinstance(node.op, ast.USub) else v
        return _UNRESOLVED
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.Mult, ast.Div, ast.Add, ast.Sub)):
        a, b = _number(node.left, consts), _number(node.right, consts)
        if isinstance(a, float) and isinstance(b, float):
            try:
                return {ast.Pow: lambda: a ** b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
                        ast.Add: lambda: a + b, ast.Sub: lambda: a - b}[type(node.op)]()
            except (ZeroDivisionError, OverflowError):
                return _UNRESOLVED
        return _UNRESOLVED
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    return _UNRESOLVED


def _values(node: ast.AST, consts: dict[str, Any]) -> tuple[Any, ...]:
    """Literal values of an expression: both branches of `a if c else b`; () when none resolve."""
    if isinstance(node, ast.IfExp):
        return _values(node.body, consts) + _values(node.orelse, consts)
    v = _number(node, consts)
    return () if v is _UNRESOLVED else (v,)


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return ""


def _kind_of_name(name: str) -> str | None:
    """Kind of a loop variable of a tolerance table (`tolerance`, `atol`, `sqnr`, `min_cos`...)."""
    low = name.lower()
    if low in TOL_NAMES:
        return TOL_NAMES[low]
    if "sqnr" in low or "snr" in low:
        return "sqnr"
    if "cos" in low:
        return "cosine"
    if "atol" in low or "rtol" in low or "qtol" in low:
        return low[low.index("tol") - 1] + "tol"
    if "tol" in low:
        return "tol"
    return None


def _mentions_metric(node: ast.AST) -> str | None:
    """'sqnr' / 'cosine' / 'mse' when the expression computes or names such a value."""
    for sub in ast.walk(node):
        ident = ""
        if isinstance(sub, ast.Call):
            ident = _name(sub.func)
        elif isinstance(sub, (ast.Name, ast.Attribute)):
            ident = _name(sub)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) < 24:
            ident = sub.value
        if ident and _METRIC_WORD.search(ident):
            low = ident.lower()
            if "cos" in low:
                return "cosine"
            if "mse" in low:
                return "mse"
            return "sqnr"
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, lines: list[str], consts: dict[str, Any]):
        self.path, self.lines, self.consts = path, lines, consts
        self.stack: list[str] = []
        self.sites: list[Site] = []
        self.forwarded = 0
        self.tables: dict[str, list[ast.AST]] = {}  # NAME = [(...), ...] seen so far (for-loop tables)

    # -- helpers -------------------------------------------------------------

    def _add(self, node: ast.AST, kind: str, values: tuple[Any, ...], how: str) -> None:
        line = getattr(node, "lineno", 1)
        end = getattr(node, "end_lineno", line) or line
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.sites.append(Site(self.path, line, end, kind, values, how, ".".join(self.stack) or "<module>", text))

    def _value_site(self, node: ast.AST, value: ast.AST, kind: str, how: str) -> None:
        vals = _values(value, self.consts)
        if vals:
            self._add(node, kind, vals, how)
        else:
            self.forwarded += 1

    # -- scopes --------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node.name)
        args = node.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            if arg.arg in TOL_NAMES:
                self._value_site(default, default, TOL_NAMES[arg.arg], "default")
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None and arg.arg in TOL_NAMES:
                self._value_site(default, default, TOL_NAMES[arg.arg], "default")
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    # -- settings ------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        func = _name(node.func)
        for kw in node.keywords:
            if kw.arg in TOL_NAMES and not (kw.arg == "tol" and func in ("set_printoptions",)):
                self._value_site(kw.value, kw.value, TOL_NAMES[kw.arg], "keyword")
        if func in _CLOSE_FUNCS:
            for index, kind in ((2, "rtol"), (3, "atol")):
                if len(node.args) > index:
                    self._value_site(node.args[index], node.args[index], kind, "positional")
        elif func in _ASSERT_CMP and len(node.args) >= 2:
            kind = _mentions_metric(node.args[0])
            vals = _values(node.args[1], self.consts)
            if kind and vals:
                self._add(node, kind, vals, "compare")
        elif _METRIC_CALL.match(func) and node.args:
            vals = _values(node.args[0], self.consts)
            if vals:
                self._add(node, "cosine" if "cos" in func.lower() else "sqnr", vals, "keyword")
        self.generic_visit(node)

    def _assign(self, node: ast.AST, targets: list[ast.AST], value: ast.AST | None) -> None:
        if value is None:
            return
        for target in targets:
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts):
                    self._assign(node, [t], v)
                continue
            name = _name(target)
            if name in TOL_NAMES and isinstance(target, (ast.Name, ast.Attribute)):
                self._value_site(node, value, TOL_NAMES[name], "assign")
            elif isinstance(target, ast.Name) and _EPS_NAME.search(name) and _values(value, self.consts):
                self._value_site(node, value, "eps", "assign")
            elif isinstance(target, ast.Name) and name.isupper() and _CONST_NAME.search(name):
                kind = next((TOL_NAMES[k] for k in ("atol", "rtol", "qtol") if k in name.lower()), None)
                kind = kind or _mentions_metric(target) or "tol"
                if isinstance(value, ast.Dict):
                    continue  # a preset table: its entries are found as dict literals
                self._value_site(node, value, kind, "constant")

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, (ast.List, ast.Tuple)):
            self.tables[node.targets[0].id] = node.value.elts
        self._assign(node, node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assign(node, [node.target], node.value)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and value is not None:
                m = _PRESET_KEY.match(key.value)
                if m:
                    self._value_site(value, value, m.group(1), "preset")
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        """`for name, tolerance, sqnr in TABLE:` over a literal list of tuples: each row is a setting."""
        target = node.target
        if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            kinds = [_kind_of_name(e.id) for e in target.elts]
            rows = self.tables.get(node.iter.id) if isinstance(node.iter, ast.Name) else None
            if rows is None and isinstance(node.iter, (ast.List, ast.Tuple)):
                rows = node.iter.elts
            for row in rows or []:
                if isinstance(row, ast.Tuple) and len(row.elts) == len(kinds):
                    for kind, elt in zip(kinds, row.elts):
                        if kind:
                            vals = _values(elt, self.consts)
                            if vals:
                                self._add(elt, kind, vals, "table")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            if not isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
                continue
            a, b = sides[i], sides[i + 1]
            for metric_side, number_side in ((a, b), (b, a)):
                vals = _values(number_side, self.consts)
                kind = _mentions_metric(metric_side)
                if vals and kind and not isinstance(metric_side, ast.Constant):
                    self._add(node, kind, vals, "compare")
                    break
        self.generic_visit(node)


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level NAME = <number> assignments, resolved in order (a constant may use an earlier one)."""
    consts: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            v = _number(stmt.value, consts)
            if v is not _UNRESOLVED:
                consts[stmt.targets[0].id] = v
    return consts


def scan_file(root: Path, rel: str) -> tuple[list[Site], int]:
    """Sites of one file and the number of forwarded (non-literal) tolerance arguments."""
    text = (root / rel).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError:
        return [], 0
    scanner = _Scanner(rel, text.splitlines(), _module_constants(tree))
    scanner.visit(tree)
    sites = sorted(set(scanner.sites), key=lambda s: (s.line, s.kind, s.how))
    return sites, scanner.forwarded


def backend_test_files(root: Path) -> list[str]:
    """Python files of every backend's test folders, the shared harness and the suite (sorted, relative)."""
    found: set[str] = set()
    for pattern in SCAN_GLOBS:
        for folder in root.glob(pattern):
            if not folder.is_dir() or SKIP_PARTS & set(folder.relative_to(root).parts):
                continue
            for path in folder.rglob("*.py"):
                rel = path.relative_to(root)
                if not SKIP_PARTS & set(rel.parts) and not rel.as_posix().startswith(SKIP_DIRS):
                    found.add(rel.as_posix())
    return sorted(found)


@dataclass
class Audit:
    root: Path
    sites: list[Site] = field(default_factory=list)
    files: int = 0
    forwarded: int = 0

    def by_backend(self) -> dict[str, list[Site]]:
        out: dict[str, list[Site]] = {}
        for s in self.sites:
            out.setdefault(s.backend, []).append(s)
        return dict(sorted(out.items()))


def scan(root: Path, paths: Iterable[str] | None = None) -> Audit:
    """Every tolerance-setting site under the test folders of `root` (an ExecuTorch tree)."""
    audit = Audit(root)
    for rel in (list(paths) if paths is not None else backend_test_files(root)):
        sites, forwarded = scan_file(root, rel)
        audit.files += 1
        audit.sites.extend(sites)
        audit.forwarded += forwarded
    return audit


# --------------------------------------------------------------------------- citations


_CITE = re.compile(r"^(?P<path>[\w./-]+\.py):(?P<lo>\d+)(?:-(?P<hi>\d+))?$")


@dataclass(frozen=True)
class Citation:
    path: str
    lo: int
    hi: int

    def __str__(self) -> str:
        return f"{self.path}:{self.lo}" + (f"-{self.hi}" if self.hi != self.lo else "")

    def covers(self, site: Site) -> bool:
        return self.path == site.path and self.lo <= site.end_line and site.line <= self.hi


def parse_citation(text: str) -> Citation | None:
    """`backends/x/test_y.py:12-14` -> Citation; None when it is not one."""
    m = _CITE.match(text.strip())
    if not m:
        return None
    lo = int(m["lo"])
    hi = int(m["hi"] or lo)
    return Citation(m["path"], lo, hi) if hi >= lo else None


def held(sites: list[Site], citations: Iterable[Citation]) -> list[bool]:
    """For each site: does some registry citation cover it?"""
    by_path: dict[str, list[Citation]] = {}
    for c in citations:
        by_path.setdefault(c.path, []).append(c)
    return [any(c.covers(s) for c in by_path.get(s.path, ())) for s in sites]


_NUM_TEXT = re.compile(r"(?<![\w.])([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_ARITH = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(\*\*|[-+*/])\s*(-?\s*\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def numbers_in(lines: list[str]) -> list[float]:
    """The numbers some source lines state: numeric literals (tokenised, so `1e-03` and `0.001`
    are one value), numbers inside string literals (`atol = "1e-4"`, `"-DET_ATOL=5.0"`) and the
    value of simple arithmetic between literals (`1.0 + 1e-03`, `2**-16`). Comments do not count.
    Shell lines fall back to every number outside `#` comments."""
    import io
    import tokenize

    text = "\n".join(lines) + "\n"
    out: list[float] = []
    chunks: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NUMBER:
                chunks.append(tok.string.replace("_", ""))
            elif tok.type == tokenize.STRING:
                chunks.append(tok.string)
            elif tok.type not in (tokenize.COMMENT,):
                chunks.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        chunks = [re.sub(r"(^|\s)#.*$", "", line) for line in lines]
    joined = " ".join(chunks)
    for m in _NUM_TEXT.finditer(joined):
        try:
            out.append(float(m.group(1)))
        except ValueError:
            pass
    for m in _ARITH.finditer(joined):
        a, op, b = float(m.group(1)), m.group(2), float(m.group(3).replace(" ", ""))
        try:
            out.append({"**": lambda: a ** b, "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                        "/": lambda: a / b}[op]())
        except (ZeroDivisionError, OverflowError):
            pass
    return out


# --------------------------------------------------------------------------- provenance


@dataclass(frozen=True)
class CitedValue:
    """One value of the registry data and one place it cites."""

    where: str  # data file: entry.key
    key: str
    value: Any
    citation: str
    host_arch: tuple[str, ...] = ()  # the entry's `when.host_arch` condition (none: unconditional)
    not_host_arch: tuple[str, ...] = ()  # its `when.not_host_arch`


def cited_values(registry: Any) -> list[CitedValue]:
    """Every (value, citation) pair of the built-in data; "bundlerun" origins are not citations."""
    from bundlerun.bundles.registry import iter_entries  # start-up: loads tomli on use

    out: list[CitedValue] = []
    for layer in registry.layers:
        if layer.label != "built-in":
            continue
        for where, entry in iter_entries(layer.data):
            values = entry_values(entry)
            for name, b in layer.data.get("backends", {}).items():
                if where == f"backends.{name}" and b.get("integer_outputs_exact"):
                    values["integer_outputs_exact"] = True
            for m in entry.get("merged", []):
                cite, key, value = parse_merged(m)
                out.append(CitedValue(f"{Path(layer.file).name}: {where} (merged)", key, value, cite))
            when = entry.get("when") or {}
            arch = tuple(when.get("host_arch", ())), tuple(when.get("not_host_arch", ()))
            for key, cites in origins_of(entry).items():
                if key not in values:
                    continue
                for c in cites:
                    if c != BUNDLERUN:
                        out.append(CitedValue(f"{Path(layer.file).name}: {where}", key, values[key], c, *arch))
    return out


def check_value(root: Path, item: CitedValue, cache: dict[str, list[str]] | None = None) -> str | None:
    """None when the cited lines hold the value; else a one-line problem."""
    import math

    from bundlerun.bundles.registry_schema import LIBRARY_DEFAULTS, RULE_EVIDENCE, UNSET_EVIDENCE, parse_citation  # late: its name is bound otherwise in this module

    parsed = parse_citation(item.citation)
    if parsed is None:
        return f"{item.where}.{item.key}: {item.citation!r} is not a citation"
    path, lo, hi, lib = parsed
    cache = {} if cache is None else cache
    if path not in cache:
        try:
            cache[path] = (root / path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return f"{item.where}.{item.key}: {path} does not exist in the source tree"
    lines = cache[path]
    if hi > len(lines):
        return f"{item.where}.{item.key}: {item.citation} is past the end of {path} ({len(lines)} lines)"
    text = "\n".join(lines[lo - 1:hi])
    value = item.value
    where = f"{item.where}.{item.key} = {value!r} cites {item.citation}"
    if value is None:
        if not any(re.search(p, text, re.I) for p in UNSET_EVIDENCE):
            return f"{where}: an unset needs `None` or `Not used` in the cited lines"
        return None
    if item.key == "integer_outputs_exact":
        return None if 0.0 in numbers_in(lines[lo - 1:hi]) else f"{where}: no 0 tolerance in the cited lines"
    if isinstance(value, bool) or isinstance(value, str):
        patterns = RULE_EVIDENCE.get((item.key, value))
        if patterns is None:
            return f"{where}: no evidence rule for {item.key}={value!r}"
        for p in patterns:
            negate = p.startswith("!")
            found = re.search(p[1:] if negate else p, text, re.I) is not None
            if found == negate:
                return f"{where}: the cited lines {'hold' if negate else 'lack'} /{p.lstrip('!')}/"
        return None
    if lib == "bool":
        if value in (0, 1) and "bool(" in text:
            return None
        return f"{where}: `(bool)` needs a bool(...) in the lines and a value of 0 or 1"
    if lib is not None:
        default = LIBRARY_DEFAULTS[lib].get(item.key)
        name = lib.split(".")[-1]
        if default is None or not math.isclose(value, default, rel_tol=1e-9) or name not in text:
            return f"{where}: not {lib}'s default {item.key} or no {name} call in the lines"
        return None
    branch = _HOST_CONDITION.search(text)
    if branch:  # `a if common.is_aarch64_host() else b`: a under when.host_arch, b under when.not_host_arch
        arm = {"aarch64", "arm64"}
        on_arm, other = float(branch.group(1)), float(branch.group(2))
        if set(item.host_arch) == arm:
            want, cond = on_arm, "when.host_arch = [aarch64, arm64]"
        elif set(item.not_host_arch) == arm:
            want, cond = other, "when.not_host_arch = [aarch64, arm64]"
        else:
            return (f"{where}: the source is `{branch.group(0).strip()}`: the entry needs the condition "
                    "(when.host_arch or when.not_host_arch = [aarch64, arm64]), not one number for every host")
        if math.isclose(value, want, rel_tol=1e-9):
            return None
        return f"{where}: the source is `{branch.group(0).strip()}`; under {cond} it must hold {want:g}"
    if any(math.isclose(value, n, rel_tol=1e-9, abs_tol=0.0) for n in numbers_in(lines[lo - 1:hi])):
        return None
    return f"{where}: the cited lines do not hold {value!r}: {text.strip()[:160]!r}"


# ExecuTorch's host condition (backends/arm/test/common.py:31-32: platform.machine() in aarch64, arm64)
_HOST_CONDITION = re.compile(r"([-+]?[\d.]+(?:[eE][-+]?\d+)?)\s+if\s+(?:\w+\.)*is_aarch64_host\(\)\s+else\s+"
                             r"([-+]?[\d.]+(?:[eE][-+]?\d+)?)")


def check_citations(registry: Any, root: Path) -> tuple[int, list[str]]:
    """(number of cited values checked, problems) for the built-in data against a source tree."""
    cache: dict[str, list[str]] = {}
    items = cited_values(registry)
    problems = [p for p in (check_value(root, item, cache) for item in items) if p]
    return len(items), problems
