"""Push-once deployment: a device-side cache keyed by content.

Every file the runner needs (runner binary, libraries, bundles, raw inputs) is
stored at `<workspace>/cache/<sha256>/<name>`. Before pushing, one `sha256sum`
over the candidates tells which are already there *and intact*; a push goes to
a `.partial` name, its size is checked with a sync STAT, and only then is it
renamed into place, so a transfer cut mid-way never poisons the cache. Each
run gets a fresh folder of symlinks (libraries keep their real names for
dlopen and LD_LIBRARY_PATH=.). All device paths are shell-quoted.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from bundlerun.bundles.fileio import file_sha256
from bundlerun.targets.remote.transport import Transport, TransportError, check_shell, shell

_HASH_CACHE: dict[tuple[str, int, int], str] = {}


def local_sha256(path: Path) -> str:
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = file_sha256(path)
    return _HASH_CACHE[key]


@dataclass
class Artifact:
    local: Path
    name: str  # file name on the device (a library keeps its soname)

    @property
    def sha256(self) -> str:
        return local_sha256(self.local)


@dataclass
class DeviceCache:
    transport: Transport
    workspace: str
    command_timeout_s: float = 60.0
    transfer_timeout_s: float = 300.0
    pushed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    _verified: set[str] = field(default_factory=set)
    used: set[str] = field(default_factory=set)  # device paths this run relied on

    @property
    def cache_dir(self) -> str:
        return posixpath.join(self.workspace, "cache")

    def remote_path(self, art: Artifact) -> str:
        return posixpath.join(self.cache_dir, art.sha256, art.name)

    def ensure(self, artifacts: list[Artifact]) -> dict[str, str]:
        """Make every artifact present and intact on the device; name -> device path."""
        paths = {a.name: self.remote_path(a) for a in artifacts}
        self.used.update(paths.values())
        todo = [a for a in artifacts if self.remote_path(a) not in self._verified]
        if not todo:
            return paths
        listing = " ".join(shlex.quote(self.remote_path(a)) for a in todo)
        res = shell(self.transport, f"sha256sum {listing} 2>/dev/null", self.command_timeout_s + 0.0)
        present: dict[str, str] = {}
        for line in res.output.splitlines():
            digest, _, name = line.partition("  ")
            if len(digest) == 64:
                present[name.strip()] = digest
        missing = []
        for art in todo:
            remote = self.remote_path(art)
            if present.get(remote) == art.sha256:
                self.reused.append(art.name)
                self._verified.add(remote)
            else:
                missing.append(art)
        if missing:
            dirs = " ".join(sorted({shlex.quote(posixpath.dirname(self.remote_path(a))) for a in missing}))
            check_shell(self.transport, f"mkdir -p {dirs}", self.command_timeout_s, "creating the cache folders")
        for art in missing:
            self._push_one(art)
        return paths

    def _push_one(self, art: Artifact) -> None:
        remote = self.remote_path(art)
        partial = posixpath.join(posixpath.dirname(remote), f".{art.name}.partial")
        size = os.path.getsize(art.local)
        self.transport.push(art.local, partial, self.transfer_timeout_s)
        st = self.transport.stat(partial, self.command_timeout_s)
        if st is None or st.size != size:
            got = "nothing" if st is None else f"{st.size} bytes"
            raise TransportError(f"push of {art.name} was incomplete: device has {got}, expected {size} bytes")
        check_shell(self.transport, f"mv -f {shlex.quote(partial)} {shlex.quote(remote)} && chmod 755 {shlex.quote(remote)}",
                    self.command_timeout_s, f"installing {art.name}")
        self.pushed.append(art.name)
        self._verified.add(remote)

    def prune(self, max_bytes: int, keep: set[str]) -> list[str]:
        """Bound the device cache: entries used by this run are touched (newest) and kept;
        the least recently used others go until the cache fits in `max_bytes`."""
        used_dirs = sorted({posixpath.dirname(p) for p in keep})
        if used_dirs:
            check_shell(self.transport, "touch " + " ".join(shlex.quote(d) for d in used_dirs),
                        self.command_timeout_s, "marking cache entries")
        cache = shlex.quote(self.cache_dir)
        res = shell(self.transport, f"cd {cache} 2>/dev/null && ls -1t | while read -r d; do du -sk \"$d\"; done",
                    self.command_timeout_s)
        entries = []  # newest first: (kB, name)
        for line in res.output.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0].isdigit() and len(parts[1].strip()) == 64:
                entries.append((int(parts[0]), parts[1].strip()))
        total, removed = 0, []
        keep_names = {posixpath.basename(d) for d in used_dirs}
        for kb, name in entries:
            total += kb * 1024
            if total > max_bytes and name not in keep_names:
                removed.append(name)
        if removed:
            targets = " ".join(shlex.quote(posixpath.join(self.cache_dir, n)) for n in removed)
            check_shell(self.transport, f"rm -rf {targets}", self.command_timeout_s, "pruning the cache")
            self._verified = {p for p in self._verified if posixpath.basename(posixpath.dirname(p)) not in removed}
        return removed

    def prepare_run_dir(self, run_dir: str, links: dict[str, str], subdirs: list[str]) -> None:
        """A clean run folder: old outputs removed, symlinks to the cached files."""
        parts = [f"rm -rf {shlex.quote(run_dir)}", f"mkdir -p {shlex.quote(run_dir)}"]
        parts += [f"mkdir -p {shlex.quote(posixpath.join(run_dir, d))}" for d in subdirs]
        for name, target in links.items():
            parts.append(f"ln -sf {shlex.quote(target)} {shlex.quote(posixpath.join(run_dir, name))}")
        check_shell(self.transport, " && ".join(parts), self.command_timeout_s, "preparing the run folder")
