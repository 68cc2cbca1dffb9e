"""The content-addressed cache of runners built from source by firmware_scripts/.

Each `$BUNDLERUN_CACHE/runners/<key>/runner.json` describes one build (kind, mode,
binary, ops, flags, sources, toolchain). Targets find their runner here when none is
configured; `doctor` lists them. An entry is relocatable: a cache restored or copied to
another path (a CI cache, a farm's shared volume) is read through `read_record`, which moves
the paths the build recorded onto where the entry is now.

A restored cache is a trust boundary: an entry is data, and what it names gets executed. So
runner.json is read with bundles/safe_read.py's bounds (a regular file inside the entry, at most
4 MiB, JSON nested at most 32 levels), every field a target reads is type-checked, and the files a
target executes or loads (`binary`, `debug_runner`, `elf`, `mlx.library`) must resolve inside the
entry's own folder. Anything else is one `RunnerEntryError` line naming the entry and the build
command that makes it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bundlerun.bundles.cache_dirs import cache_root  # the one cache root (bundles/cache_dirs.py)
from bundlerun.bundles.errors import TargetError
from bundlerun.bundles.limits import MAX_RECORD_BYTES
from bundlerun.bundles.safe_read import UnsafeFileError, inside, load_json_bounded
from bundlerun.targets.failures import FailureKind

# the files a target executes or loads, by their dotted key: they must lie inside the entry
EXECUTED = ("binary", "debug_runner", "elf", "mlx.library")
_STR, _INT, _NUM, _BOOL, _NONE = (str,), (int,), (int, float), (bool,), (type(None),)
_STRS = "list of text"  # a list whose items are all text
# the type of every field a target or `doctor` reads (unknown fields are kept as recorded: the build
# scripts add fields over time); "flags" is a list of build flags, or arm-qemu's table of them
FIELDS: dict[str, tuple | str] = {
    "kind": _STR, "arch": _STR, "mode": _STR, "machine": _STR, "cpu": _STR, "built_at": _STR,
    "binary": _STR, "debug_runner": _STR, "elf": _STR,
    "build_seconds": _NUM, "jobs": _INT, "debug_buffer_size": _INT + _NONE,
    "static": _BOOL, "etdump": _BOOL, "bundle_io": _BOOL,
    "backends": _STRS, "kernels": _STRS, "ops": _STRS, "patches": _STRS, "qemu": _STRS,
    "flags": (dict, list), "sources": (dict,), "mlx": (dict,), "glslc": (dict,), "xnnpack": (dict,),
    "size": (dict,), "library_build": (dict,), "toolchain": _STR + (dict,) + _NONE,
    "flags.fault": _STR, "flags.etdump": _BOOL, "flags.method_pool_size": _INT + _NONE,
    "flags.debug_buffer_size": _INT + _NONE,
    "mlx.version": _STR + _NONE, "mlx.library": _STR, "glslc.version": _STR, "sources.fingerprint": _STR,
}
# the build command that makes an entry again, by kind (firmware_scripts/; --rebuild starts afresh)
REBUILD = {
    "arm-qemu": "bash firmware_scripts/arm/build_qemu_runner.sh --force",
    "mlx_executor_runner": "bash firmware_scripts/mlx/build_mlx_runner.sh --rebuild",
    "executor_runner": "bash firmware_scripts/android/build_executor_runner.sh --toolchain gnu --arch {arch} --rebuild",
    "debug_runner": "bash firmware_scripts/android/build_executor_runner.sh --toolchain gnu --arch {arch} "
                    "--debug-runner --rebuild",
}


class RunnerEntryError(TargetError):
    """A runner-cache entry that cannot be trusted: one line naming it, why, and how to rebuild it.
    `runner_kind` is the entry's kind when that much could be read (so other kinds' lookups skip it)."""

    def __init__(self, path: Path | str, reason: str, record: dict[str, Any] | None = None):
        record = record if isinstance(record, dict) else {}
        kind = record.get("kind") if isinstance(record.get("kind"), str) else None
        self.runner_kind = kind
        super().__init__(f"runner entry damaged: {path}: {reason}; rebuild with {rebuild_command(record)}",
                         kind=FailureKind.TOOL_FAILED)


def rebuild_command(record: dict[str, Any]) -> str:
    """The firmware_scripts command that builds the entry `record` describes again."""
    kind, arch = record.get("kind"), record.get("arch")
    backends = record.get("backends") if isinstance(record.get("backends"), list) else []
    if kind == "executor_runner" and "vulkan" in backends and arch == "x86_64":
        return "bash firmware_scripts/vulkan/build_vulkan_runner.sh --rebuild"
    template = REBUILD.get(kind) if isinstance(kind, str) else None
    if template is None:
        return "the firmware_scripts/ build script that made it (or delete the entry's folder)"
    return template.format(arch=arch if isinstance(arch, str) and arch.isidentifier() else "ARCH")


def read_record(folder: Path) -> dict[str, Any] | None:
    """The runner.json of the cache entry `folder`, with its folder under "dir"; None when there is
    none; RunnerEntryError when it is unreadable, malformed, wrong-typed, or names an executed file
    outside `folder` (after the move below, with every link resolved).

    The build scripts record absolute paths (`binary`, `elf`, the sources they used). Where the cache
    has moved since, every recorded path under the old `<root>/runners/<key>/` is moved onto `folder`
    and every other one under the old `<root>/` onto the cache root `folder` is in now, so a copied
    cache names its own files, never the ones it was built beside."""
    folder = Path(folder)
    meta = folder / "runner.json"
    if not os.path.lexists(meta):
        return None
    try:
        record = load_json_bounded(meta, MAX_RECORD_BYTES, root=folder)
    except UnsafeFileError as exc:
        raise RunnerEntryError(meta, str(exc).removeprefix(f"{meta}: ")) from None
    if not isinstance(record, dict):
        raise RunnerEntryError(meta, f"runner.json holds {type(record).__name__}, not a table")
    old_root = _recorded_root(record, folder.name)
    new_root = folder.parent.parent
    if old_root is not None and old_root != str(new_root):
        record = _rebased(record, old_root, str(new_root))
    _check_record(folder, record)
    record["dir"] = str(folder)
    return record


def _field(record: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    parent: Any = record
    for part in dotted.split("."):
        if not isinstance(parent, dict) or part not in parent:
            return False, None
        parent = parent[part]
    return True, parent


def _check_record(folder: Path, record: dict[str, Any]) -> None:
    """RunnerEntryError unless every known field has its type and every executed file is inside `folder`."""
    meta = folder / "runner.json"
    if not isinstance(record.get("kind"), str):
        raise RunnerEntryError(meta, "runner.json names no kind", record)
    for key, kinds in FIELDS.items():
        present, value = _field(record, key)
        if not present:
            continue
        if kinds == _STRS:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            want = kinds if isinstance(kinds, str) else " or ".join(
                "null" if k is type(None) else k.__name__ for k in kinds)
            raise RunnerEntryError(meta, f"{key} is {type(value).__name__} {str(value)[:60]!r}, not {want}", record)
    if record["kind"] == "arm-qemu" and not isinstance(record.get("flags", {}), dict):
        raise RunnerEntryError(meta, "flags of an arm-qemu runner is not a table", record)
    program = "elf" if record["kind"] == "arm-qemu" else "binary"  # what every build of that kind records
    if program not in record:
        raise RunnerEntryError(meta, f"runner.json names no {program}", record)
    for key in EXECUTED:
        present, value = _field(record, key)
        if not present:
            continue
        if value.strip() == "" or "\0" in value:
            raise RunnerEntryError(meta, f"{key} is empty or not a path", record)
        path = Path(value) if os.path.isabs(value) else folder / value
        try:
            inside(path, folder)
        except UnsafeFileError:
            raise RunnerEntryError(meta, f"{key} {value[:200]!r} lies outside the entry (it may only name its "
                                           "own files)", record) from None
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            pass  # not built, or removed: the target says the runner is missing
        except OSError as exc:  # a name too long, a loop: not a file a build wrote
            raise RunnerEntryError(meta, f"{key} {value[:200]!r}: {exc.strerror}", record) from None
        _set(record, key, str(path))


def _set(record: dict[str, Any], dotted: str, value: str) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        record = record[part]
    record[last] = value


def _recorded_root(value: Any, key: str) -> str | None:
    """The cache root the build ran in: the prefix of any recorded `<root>/runners/<key>/...` path."""
    if isinstance(value, str):
        marker = f"/runners/{key}/"
        at = value.find(marker)
        return value[:at] if value.startswith("/") and at > 0 else None
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        root = _recorded_root(child, key)
        if root is not None:
            return root
    return None


def _rebased(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {k: _rebased(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebased(v, old, new) for v in value]
    return value


def cached_runners(kind: str | None = None) -> list[dict[str, Any]]:
    """Every runner.json of `kind` (newest first), each with its folder under "dir". A damaged entry
    of that kind, or of a kind that cannot be read, is a RunnerEntryError; one of another kind is
    left to its own target. Folders whose name has a dot (`<key>.partial`, a build in progress) are
    not entries yet."""
    found = []
    root = cache_root() / "runners"
    if not root.is_dir():
        return []
    for meta in sorted(root.glob("*/runner.json")):
        if "." in meta.parent.name:
            continue
        try:
            record = read_record(meta.parent)
        except RunnerEntryError as exc:
            if kind and exc.runner_kind not in (None, kind):
                continue
            raise
        if record is None or (kind and record.get("kind") != kind):
            continue
        found.append(record)
    return sorted(found, key=lambda r: str(r.get("built_at", "")), reverse=True)


def find_runner(kind: str, binary_key: str, **flags: Any) -> Path | None:
    """The newest cached runner of `kind` whose record matches `flags` (top level or under "flags")."""
    for record in cached_runners(kind):
        flags_record = record.get("flags")
        have = {**(flags_record if isinstance(flags_record, dict) else {}), **record}
        if all(have.get(k) == v for k, v in flags.items()):
            path = Path(str(record.get(binary_key, "")))
            if path.is_file():
                return path
    return None


def runner_binary(path: str | Path, what: str, hint: str, *, executable: bool = True) -> Path:
    """The runner binary a target is about to start, as an absolute path (a relative setting is taken
    from bundlerun's working folder, not the case folder the runner starts in); TargetError "runner
    binary <path> missing / not executable; <hint>" when it cannot be started, so that is said as such
    instead of as an OSError from the process start. `executable=False`: read by an emulator (qemu-user)."""
    binary = Path(os.path.abspath(os.path.expanduser(str(path))))
    if not binary.exists():
        problem = "missing"
    elif not binary.is_file():
        problem = "not a regular file"
    elif executable and not os.access(binary, os.X_OK):
        problem = "not executable (chmod +x)"
    elif not os.access(binary, os.R_OK):
        problem = "not readable"
    else:
        return binary
    shown = str(path) if str(path) == str(binary) else f"{path} ({binary})"
    raise TargetError(f"{what} runner binary {shown} {problem}; {hint}")


def run_build(cmd: list[str], log: Path, timeout_s: float, script: str) -> tuple[Path | None, str]:
    """Run a firmware_scripts build in its own process group (the whole build is killed on a
    timeout or Ctrl-C), its stderr into `log`. Returns (the folder the script printed last, "")
    or (None, why: the script's own last error line `<script>: ...`, else the log's last line)."""
    import signal
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except BaseException:  # timeout, Ctrl-C: the whole build goes
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        why = next((ln for ln in reversed(lines) if ln.startswith(f"{script}:")),
                   lines[-1] if lines else f"exit code {proc.returncode}")
        return None, why
    return Path(out.decode().strip().splitlines()[-1]), ""
