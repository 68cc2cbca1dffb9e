"""The fast tier: which tests are `slow` (they build a bundle or start a process), decided at
collection time so that a new test lands in the right tier without anyone marking it by hand.

`pytest -m "not slow"` runs the rest, the pure-Python tests (the developer's quick loop); `.ci/run`
and scripts/test.sh still run everything. A test is slow when any of these holds:

1. it is marked `@pytest.mark.slow` by hand (kept as is);
2. it is in SLOW_TESTS (what the scan below cannot see, each with the reason);
3. the code it reaches contains a STARTER: the test function itself, every fixture in its closure
   (`item.fixturenames` is already transitive) and, followed transitively, every function, class or
   module-level name they refer to that is defined under tests/ (helpers, doubles, fixtures' helpers).
   Code outside tests/ (bundlerun, the standard library) is not followed: the STARTER names cover
   the calls into it that build or start something.

The scan cannot be complete (a test may reach a process through bundlerun code it does not name),
so the fast tier guards itself: under `-m "not slow"` every attempt to start a process fails the test
with "this test starts a process: it belongs to the slow tier" (`process_guard`, used by conftest.py).
The one program it lets through is `git`, which history runs to record a report's commit.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import textwrap
import types
from functools import lru_cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Calls that build a bundle or start a process / runtime, matched in the scanned source text (comments
# and docstrings included: a false match only moves a test to the slow tier, never out of it).
STARTERS = re.compile(r"""
    \bsubprocess\.(run|Popen|call|check_call|check_output|getoutput|getstatusoutput)\b
  | \bPopen\b | \bposix_spawnp?\b | \bos\.(system|fork|exec\w*|popen)\b
  | \bmultiprocessing\b | \bProcessPoolExecutor\b | \bcreate_subprocess_(exec|shell)\b
  | \bpexpect\b
  | \bbuild_bundle\b | \bbuild_zoo\b | \brun_accuracy\b                 # bundles/builder.py: real ExecuTorch export
  | \bto_edge\w* | \btorch\.export\.export\b | \bLoweringRequest\b      # an ExecuTorch export / lowering in-process
  | \b_load_for_executorch\w* | \bportable_lib\b                       # the ExecuTorch runtime in-process
  | \bcheck_page\b                                                     # tests/browser.py: starts Chromium
""", re.VERBOSE)

# Tests ("file::function") that are slow although the scan cannot see it (the process starts inside
# code outside tests/ that the test does not name), one reason each.
SLOW_TESTS: dict[str, str] = {
    "test_api.py::test_the_documented_example_runs": "exec()s docs/api.md's example, which builds and runs a bundle",
    "test_mlx_build.py::test_codegen_regenerates_the_missing_files": "bundles/mlx_codegen.py runs flatc",
    "test_mlx_build.py::test_overlay_leaves_the_installed_package_alone":
        "ensure_mlx_importable runs flatc when the overlay is not cached yet (a fresh machine)",
    "test_mlx_cpp_delegate.py::test_validate_zoo_on_the_cpp_delegate_from_the_cli":
        "run_cli starts `bundlerun validate` once setup has built the MLX runner",
    "test_labgrid_target.py::test_an_agent_that_does_not_answer_is_killed": "targets/labgrid.py's Coordinator starts the agent",
    "test_suite_plugin.py::test_the_suite_pieces_bundlerun_relies_on":
        "ExecuTorch's all_flows() registers the Arm flows by starting the FVP binaries (`--version`)",
}

SLOW_REASON = "tests/tiers.py: builds a bundle or starts a process"


def _source(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return ""


def _in_tests(obj) -> bool:
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:
        return False
    # this module's own guard names every way to start a process: it is not followed
    return path is not None and Path(path).resolve().is_relative_to(TESTS) and Path(path).resolve() != Path(__file__).resolve()


def _tests_module(name: str) -> types.ModuleType | None:
    """The module `name` when it is a helper under tests/ (imported if needed), else None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not Path(spec.origin).resolve().is_relative_to(TESTS):
        return None
    return importlib.import_module(name)


def _referenced(obj, source: str) -> list[object]:
    """The objects defined under tests/ that `source` (the code of `obj`) names: bare names resolved
    in the module's globals, and `module.attr` where `module` is a tests/ helper module."""
    module = inspect.getmodule(obj)
    scope = vars(module) if module is not None else {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            helper = _tests_module(node.module)  # a function-local `from doubles.adbd import FakeAdbd`
            for alias in (node.names if helper is not None else ()):
                target = getattr(helper, alias.name, None)
                if isinstance(target, (types.FunctionType, type)) and _in_tests(target):
                    found.append(target)
            continue
        if isinstance(node, ast.Name):
            target = scope.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = scope.get(node.value.id)
            if isinstance(owner, types.ModuleType) and _in_tests(owner):
                target = getattr(owner, node.attr, None)
        if (isinstance(target, (types.FunctionType, type)) and target is not obj and _in_tests(target)):
            found.append(getattr(target, "__wrapped__", target))
    return found


@lru_cache(maxsize=None)
def _scan(obj) -> tuple[bool, tuple]:
    """Whether `obj`'s own code contains a STARTER, and the tests/ objects it names."""
    source = _source(obj)
    return bool(STARTERS.search(source)), tuple(_referenced(obj, source))


@lru_cache(maxsize=None)
def _starts(obj) -> bool:
    """Whether `obj`'s code, or tests/ code it names (transitively), contains a STARTER."""
    seen, todo = {obj}, [obj]
    while todo:
        starts, refs = _scan(todo.pop())
        if starts:
            return True
        todo.extend(ref for ref in refs if ref not in seen)
        seen.update(refs)
    return False


def is_slow(item: pytest.Item) -> bool:
    """The rules of this module's docstring, in its order."""
    if item.get_closest_marker("slow") is not None:
        return True
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    if module is not None and function is not None and f"{Path(module.__file__).name}::{function.__name__}" in SLOW_TESTS:
        return True
    if function is not None and _starts(getattr(function, "__func__", function)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        func = defs[-1].func
        if _in_tests(func) and _starts(getattr(func, "__wrapped__", func)):
            return True
    return False


def mark_slow(items: list[pytest.Item]) -> None:
    """pytest_collection_modifyitems: add the `slow` marker to every test `is_slow` picks."""
    for item in items:
        if item.get_closest_marker("slow") is None and is_slow(item):
            item.add_marker(pytest.mark.slow(reason=SLOW_REASON))


# --- the fast tier's guard -------------------------------------------------------------------------

SPAWN_ERROR = "this test starts a process: it belongs to the slow tier"


class StartsProcess(BaseException):
    """A BaseException, so code under test that turns OSError into an exit code cannot hide it."""


def fast_tier(config: pytest.Config) -> bool:
    return (config.option.markexpr or "").strip() == "not slow"


def _git(popen, args, *rest) -> bool:
    """`git` is the one program the fast tier may start: history records the commit a report came
    from (runner/history/commits.py: `git rev-parse`, `git show`), a few ms; it is no build and no runtime."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return bool(argv) and os.path.basename(os.fsdecode(argv[0])) == "git"


def process_guard():
    """A context manager that makes every way of starting a process raise StartsProcess, and
    records the attempt so the test fails even where the exception is swallowed."""
    attempts: list[str] = []

    def refuse(what: str, allow=None):
        def blocked(*args, **kwargs):
            if allow is not None and allow(*args):
                return original(*args, **kwargs)
            attempts.append(what)
            raise StartsProcess(f"{SPAWN_ERROR} ({what})")
        return blocked

    original = subprocess.Popen._execute_child
    mp = pytest.MonkeyPatch()
    mp.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen", allow=_git))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            mp.setattr(os, name, refuse(f"os.{name}"))
    return mp, attempts
