"""Shared fixtures. Bundles are built once per test session with the real
ExecuTorch toolchain and cached by (model, backend, dtype, cases, target)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bundlerun.bundles.stack_room import call_with_stack_room

REPO = Path(__file__).resolve().parents[1]

# .ci/run runs this suite with CI=true, which turns on `--require-seal` by default (runner/seal.py).
# The suite judges bundles made with ExecuTorch's own API (unsealed by nature) as a developer's local
# run does; tests/test_security_seal.py sets CI itself for every case of that default.
os.environ.pop("CI", None)

# No test writes the user's own history (~/.local/share/bundlerun/history.sqlite): a command a test
# runs without --history or --no-history records into this session's private data folder instead.
_DATA_HOME = tempfile.mkdtemp(prefix="bundlerun-test-data-")
os.environ["XDG_DATA_HOME"] = _DATA_HOME
os.environ.pop("BUNDLERUN_HISTORY", None)
atexit.register(shutil.rmtree, _DATA_HOME, True)


def pytest_unconfigure(config):
    """The data folder goes with the session too: an xdist worker may end without running atexit."""
    shutil.rmtree(_DATA_HOME, ignore_errors=True)


def pytest_configure(config):
    """xdist's `--dist loadfile` queues files by test count unless told not to (`--loadscope-reorder`,
    on by default): off, so the order below (tests/file_order.py) is the order the workers get."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Each test body runs with frame-stack room (bundles/stack_room.py), as the `bundlerun`
    command and its workers do: in-process exports and torch imports at pytest's depth can otherwise
    map and unmap a frame chunk on every call."""
    from _pytest.python import pytest_pyfunc_call as run_test  # pytest's own implementation of this hook

    return call_with_stack_room(run_test, pyfuncitem)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """Fixtures (most of the suite's builds) with the same frame-stack room as the tests."""
    from _pytest.fixtures import pytest_fixture_setup as set_up  # pytest's own implementation of this hook

    return call_with_stack_room(set_up, fixturedef, request)


def pytest_collection_modifyitems(config, items):
    """Mark every test that builds a bundle or starts a process `slow` (tests/tiers.py), so
    `pytest -m "not slow"` is the fast, pure-Python tier; then the files that take longest first
    (tests/file_order.py), so the two xdist workers end together."""
    from file_order import heaviest_files_first
    from tiers import mark_slow

    mark_slow(items)
    heaviest_files_first(items)


@pytest.fixture(scope="session", autouse=True)
def _fast_tier_guard(request):
    """Under `-m "not slow"` no process may start (tests/tiers.py `process_guard`): a test that
    starts one fails, which tells the classifier in tests/tiers.py what it missed."""
    from tiers import fast_tier, process_guard

    if not fast_tier(request.config):
        yield None
        return
    mp, attempts = process_guard()
    try:
        yield attempts
    finally:
        mp.undo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item.stash[CALL_FAILED] = outcome.get_result().failed


CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _no_process_in_fast_tier(_fast_tier_guard, request):
    """Fail a fast-tier test that tried to start a process even where the code under test
    swallowed the exception (a test the guard's exception already failed is not reported twice)."""
    if _fast_tier_guard is None:
        yield
        return
    before = len(_fast_tier_guard)
    yield
    if len(_fast_tier_guard) > before and not request.node.stash.get(CALL_FAILED, False):
        from tiers import SPAWN_ERROR

        pytest.fail(f"{SPAWN_ERROR} ({', '.join(_fast_tier_guard[before:])})", pytrace=False)


@pytest.fixture(autouse=True)
def _process_tag(monkeypatch):
    """Every process a test starts inherits a tag of that test (tests/proc_helpers.py `mine`), so a
    check that nothing is left running sees only what this test started, never a parallel worker's."""
    from proc_helpers import TAG_VAR, new_tag

    tag = new_tag()
    monkeypatch.setenv(TAG_VAR, tag)
    return tag


@pytest.fixture(scope="session")
def bundle_cache(tmp_path_factory):
    """A bundle to run, built once per session and through bundlerun's content-addressed build cache
    (`cache=True`, as `bundlerun build` does by default): the key covers the bundles/ code, the model,
    every option and the package versions, so a cached bundle is the bundle this tree would build. Tests
    of the build itself call build_bundle or the CLI with the cache off; `cache=False` here does too."""
    root = tmp_path_factory.mktemp("bundles")
    built: dict[tuple, Path] = {}

    def get(model: str, dtype: str = "fp32", backend: str | None = None, cases: int = 4,
            target: str = "host://xnnpack", **kw) -> Path:
        key = (model, dtype, backend, cases, target, tuple(sorted(kw.items())))
        if key not in built:
            from bundlerun.bundles.builder import BuildRequest, build_bundle
            from bundlerun.targets import default_backend, lowering_info

            name = "-".join(str(k).replace("/", "_").replace(":", "_") for k in key[:5]) + f"-{len(built)}.bpte"
            kw.setdefault("cache", True)
            result = build_bundle(BuildRequest(model=model, output=root / name, dtype=dtype,
                                               backend=backend or default_backend(target, dtype),
                                               cases=cases, target=target, target_info=lowering_info(target), **kw))
            built[key] = result.path
        return built[key]

    return get


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `bundlerun` entry point in a fresh process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", *args],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private HOME: adb keys and ~/.android never touch the user's."""
    h = tmp_path / "home"
    h.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("ANDROID_USER_HOME", raising=False)
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    return h


@pytest.fixture
def device(tmp_path):
    """The emulated Android device (real ADB protocol); nothing may survive a test."""
    from doubles.adbd import FakeAdbd

    d = FakeAdbd(tmp_path / "device")
    d.start()
    yield d
    d.stop()
    assert d.live_processes() == []


QEMU_BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "firmware_scripts" / "arm" / "build_qemu_runner.sh"


@pytest.fixture(scope="session")
def qemu_runner():
    """Build (or fetch from the cache) a runner variant: qemu_runner('--fault', 'spin')."""
    import fcntl
    import shutil
    import tempfile

    missing = [tool for tool in ("qemu-system-arm", "arm-none-eabi-gcc", "arm-none-eabi-g++", "cmake", "ninja")
               if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"QEMU firmware tests need {', '.join(missing)} (scripts/setup.sh installs them)")
    built: dict[tuple[str, ...], Path] = {}

    def build(*args: str) -> Path:
        if args not in built:
            lock = Path(tempfile.gettempdir()) / "bundlerun-qemu-build.lock"
            with open(lock, "w") as fh:  # xdist workers share one build tree: one build at a time
                fcntl.flock(fh, fcntl.LOCK_EX)
                proc = subprocess.run(["bash", str(QEMU_BUILD_SCRIPT), *args], capture_output=True, text=True,
                                      timeout=3600)
            assert proc.returncode == 0, f"build_qemu_runner.sh {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
            folder = Path(proc.stdout.strip().splitlines()[-1])
            assert (folder / "arm_executor_runner.elf").is_file(), proc.stdout
            built[args] = folder
        return built[args]

    return build
