"""The house's rules, read from the source (docs/architecture.md): no import circle among
bundlerun's own modules, no import from a higher floor (bundles <- targets <- runner <- api),
and no loose module in runner/ beside its rooms except the front door.

Pure Python: every module under bundles/, targets/, runner/ and bundlerun/ is parsed with `ast`
(nothing imported). An edge is any import of a bundlerun module, at module top or inside a function;
imports under `if TYPE_CHECKING:` are left out (they never run), and so are the tables that name
modules as strings for `importlib` to load on demand (the CLI's commands, the targets, the backend
recipes): a plugin registry, whose plugins import the registry's types.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"bundlerun.bundles": "bundles", "bundlerun.targets": "targets", "bundlerun.runner": "runner",
           "bundlerun": "bundlerun"}
FLOORS = {"bundlerun.bundles": 0, "bundlerun.targets": 1, "bundlerun.runner": 2}  # anything else in bundlerun/: 3
LEAVES = {"bundlerun", "bundlerun._version"}  # no imports of their own: every floor may read the version
# the front door: runner/'s entry points (console script, pytest11 plugin) and what the CLI and
# the API call first; every other module of runner/ lives in a room (a sub-package)
FRONT_DOOR = {"__init__", "cli", "arguments", "session", "settings", "interrupts", "seal", "shard", "inspect_view", "stateful",
              "preload", "pytest_plugin"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        base = ROOT / folder
        files = base.glob("*.py") if folder == "bundlerun" else base.rglob("*.py")
        for path in files:
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk(tree: ast.AST):
    """ast.walk without the bodies of `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                todo.extend(getattr(child, "orelse", []))
            else:
                todo.append(child)


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    out.add(f"{base}.{alias.name}")
                elif base in modules:
                    out.add(base)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def _floor(module: str) -> int:
    for package, floor in FLOORS.items():
        if module == package or module.startswith(package + "."):
            return floor
    return 3


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one circle's path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative: the graph is deeper than the recursion limit allows for
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(_circle(graph, set(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One concrete circle inside a component: a path from its first module back to itself."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for child in sorted(graph[node] & component):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                todo.append(child)
    return sorted(component)


def test_the_graph_sees_the_tree():
    graph = _graph()
    assert "bundlerun.runner.cli" in graph and "bundlerun.bundles.bpte" in graph
    assert "bundlerun.bundles.sequence" in graph["bundlerun.runner.session"]  # a top-level import is an edge
    assert "bundlerun.api" not in set().union(*graph.values())  # nothing imports the API


def test_no_import_circle():
    circles = _cycles(_graph())
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_no_import_from_a_higher_floor():
    upward = sorted(f"{a} -> {b}" for a, targets in _graph().items() for b in targets
                    if b not in LEAVES and _floor(b) > _floor(a))
    assert upward == [], "imports from a higher floor:\n" + "\n".join(upward)


def test_runner_holds_rooms_and_only_the_front_door_loose():
    loose = sorted(p.stem for p in (ROOT / "runner").glob("*.py") if p.stem not in FRONT_DOOR)
    assert loose == [], f"modules loose in runner/ (put each in its room): {loose}"


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# ---------------------------------------------------------------- rooms (docs/architecture.md "Rooms and layers")

# runner/'s rooms in layers, lowest first: a module may import its own room and any room in a lower
# layer, never a higher one. The front door is two rooms: `run` (what the CLI and the API call first:
# session, interrupts, seal, shard, stateful, arguments, inspect_view) sits above the rooms it
# assembles a run from, `entry` (cli, pytest_plugin) on top.
ROOM_LAYERS: tuple[tuple[str, ...], ...] = (
    ("judging",),
    ("report",),
    ("history",),
    ("writers",),
    ("pictures",),
    ("run",),
    ("debug", "farm", "suite"),
    ("commands",),
    ("entry",),
)
ENTRY = {"__init__", "cli", "pytest_plugin"}
# Imports against the layers, each with its reason. A new one goes here with a reason, or the module moves.
ROOM_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("bundlerun.runner.judging.judge", "bundlerun.runner.report.model"):
        "the judge makes the report's own records (CaseRecord, OutputRecord, Summary)",
    ("bundlerun.runner.judging.judge", "bundlerun.runner.report.sequences"):
        "a stateful sequence's verdict is judged into the report's sequence records",
    ("bundlerun.runner.judging.replay", "bundlerun.runner.report.safe_text"):
        "replay's findings quote outside text, made inert as every report line is",
    ("bundlerun.runner.judging.calibrate", "bundlerun.runner.report.safe_text"):
        "the proposed TOML quotes outside names, made inert as every report line is",
    ("bundlerun.runner.judging.calibrate", "bundlerun.runner.history.saved_run"):
        "`tolerance suggest` reads an earlier run back from the history",
    ("bundlerun.runner.judging.calibrate", "bundlerun.runner.session"):
        "`tolerance suggest` runs the bundle itself when no earlier run is given",
    ("bundlerun.runner.report.merge", "bundlerun.runner.shard"):
        "merging shard reports reads the shard plan each shard recorded",
    ("bundlerun.runner.writers.html", "bundlerun.runner.pictures.plots"):
        "the HTML report embeds the PNGs plots.py draws",
    ("bundlerun.runner.commands.accuracy", "bundlerun.runner.cli"):
        "`accuracy` shares the run options and the progress bar of `run`",
    ("bundlerun.runner.commands.bisect", "bundlerun.runner.cli"):
        "`bisect` shares the build options of `build`",
}


def _room(module: str) -> str | None:
    """The room of a runner/ module (None outside runner/)."""
    prefix = "bundlerun.runner."
    if module == "bundlerun.runner":
        return "entry"
    if not module.startswith(prefix):
        return None
    first = module[len(prefix):].split(".")[0]
    if (ROOT / "runner" / first).is_dir():
        return first
    return "entry" if first in ENTRY else "run"


def _layer(room: str) -> int:
    return next(i for i, rooms in enumerate(ROOM_LAYERS) if room in rooms)


def _against_layers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for a, targets in graph.items():
        room_a = _room(a)
        if room_a is None:
            continue
        for b in targets:
            room_b = _room(b)
            if room_b is None or room_b == room_a:
                continue
            if _layer(room_b) >= _layer(room_a):
                found.append((a, b))
    return sorted(found)


def test_every_room_has_a_layer():
    rooms = {p.name for p in (ROOT / "runner").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    placed = {room for layer in ROOM_LAYERS for room in layer}
    assert rooms | {"run", "entry"} == placed, f"rooms without a layer (add them to ROOM_LAYERS): {rooms - placed}"


def test_rooms_import_only_lower_layers():
    wrong = [edge for edge in _against_layers(_graph()) if edge not in ROOM_EXCEPTIONS]
    assert wrong == [], ("imports from a room in the same or a higher layer (move the module, or list the "
                         "import in ROOM_EXCEPTIONS with its reason):\n" + "\n".join(f"{a} -> {b}" for a, b in wrong))


def test_every_room_exception_is_still_needed():
    stale = sorted(set(ROOM_EXCEPTIONS) - set(_against_layers(_graph())))
    assert stale == [], f"ROOM_EXCEPTIONS no longer needed (remove them): {stale}"


# ---------------------------------------------------------------- function-level imports


def _function_level_imports() -> list[tuple[str, int, bool]]:
    """(path, line, says why) for every import of bundlerun's own modules inside a function."""
    found = []
    for name, path in _modules().items():
        source = path.read_text()
        lines = source.splitlines()
        for fn in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                if isinstance(node, ast.Import):
                    ours = any(a.name.split(".")[0] == "bundlerun" for a in node.names)
                else:
                    ours = bool(node.level) or (node.module or "").split(".")[0] == "bundlerun"
                if not ours:
                    continue
                text = "\n".join(lines[node.lineno - 1: node.end_lineno])
                above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
                found.append((str(path.relative_to(ROOT)), node.lineno, "#" in text or above.startswith("#")))
    return sorted(set(found))


def test_every_function_level_import_says_why():
    """bundlerun's own modules are imported at a module's top; one imported inside a function says why
    in a comment on its line or the line above (start-up time, an optional dependency, a name looked up
    at call time)."""
    silent = [f"{path}:{line}" for path, line, why in _function_level_imports() if not why]
    assert silent == [], ("imports inside functions without a comment saying why (hoist them to the module's "
                          "top, or say why they are late):\n" + "\n".join(silent))
