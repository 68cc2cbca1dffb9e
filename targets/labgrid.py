"""`labgrid://PLACE/<inner URL>`: a board reserved through a labgrid coordinator.

    bundlerun run X.bpte --target labgrid://board-7/                      # the place's serial port
    bundlerun run X.bpte --target 'labgrid://board-7/rfc2217://?reset=none'
    bundlerun run X.bpte --target 'labgrid://?tag=soc=an547,pool=ci'      # any free place of a pool
    bundlerun run X.bpte --target 'labgrid://phone-2/adb+tcp://'          # network ADB of the place

Steps: connect to the coordinator (labgrid >= 24 speaks gRPC; address from `?coordinator=`,
`[targets.labgrid] coordinator`, `$LG_COORDINATOR`, else 127.0.0.1:20408), acquire the place
(or the first free place whose tags match; `wait_s` waits for one to free), resolve what the
exporter publishes for it into the inner target's URL, run the inner target, and release the
place on every way out: a finished run, a failed one, a timeout, an exception, Ctrl-C.

Resolution: a `NetworkSerialPort` (the exporter's ser2net, RFC 2217) becomes
`rfc2217://HOST:PORT` for the serial target (with `ign_set_control`, as labgrid's own
SerialDriver opens it, and the exported speed as `baudrate`), a raw one
`serial+socket://HOST:PORT`; a `NetworkService` named `adb*` (labgrid has no ADB resource
class: a network ADB device is published as a NetworkService) becomes `adb+tcp://ADDRESS:PORT`.
An inner URL with an empty host (`rfc2217://`, `adb+tcp://`) picks the kind; one with a host is
used as it is (the reservation then only guards the board).

Query keys and config keys that are not labgrid:// settings (below) go to the inner target.

labgrid never runs in bundlerun's process: its `pyserial-labgrid` fork installs over pyserial's
`serial` package, which the serial target needs as it is. It lives in a venv of its own
(scripts/setup.sh: .venv-labgrid), and every labgrid call goes through targets/labgrid_agent.py
run by that venv's interpreter (`python=` / $BUNDLERUN_LABGRID_PYTHON, else the interpreter of
`labgrid-client` on PATH, else <repo>/.venv-labgrid/bin/python): one agent process per run,
JSON lines over its stdin/stdout, every answer awaited for a bounded time.

Over 500 lines on purpose: the target, its settings and the client of its one agent process share
that process's lifetime; the agent itself is targets/labgrid_agent.py.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL, inner_default_backend, path_inner_url
from bundlerun.targets.base import TargetBase
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.settings import parse_settings
from bundlerun.targets import parse_target_url

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle
    from bundlerun.targets.base import RunOptions, TargetRun

DEFAULT_COORDINATOR = "127.0.0.1:20408"
SERIAL_SCHEMES = ("rfc2217", "serial+socket", "serial")
ADB_SCHEMES = ("adb+tcp",)


@dataclass
class LabgridSettings:
    """[targets.labgrid] / labgrid://PLACE/INNER?key=value"""

    coordinator: str = ""  # HOST[:PORT] of the coordinator; default $LG_COORDINATOR, then 127.0.0.1:20408
    tag: str = ""  # k=v[,k=v...]: a pool, any place carrying all these tags (instead of a place name)
    acquire: bool = True  # false: use a place you already acquired yourself, and leave it acquired
    wait_s: float = 0.0  # wait up to this long for a busy place (or a free place of the pool)
    poll_s: float = 1.0  # how often to look again while waiting
    coordinator_timeout_s: float = 15.0  # bound of each coordinator call (connect, acquire, release)
    resource: str = ""  # the name of the resource to use when the place exports several
    python: str = ""  # a venv's python with labgrid; default $BUNDLERUN_LABGRID_PYTHON, labgrid-client's, .venv-labgrid

    def validate(self) -> None:
        if self.wait_s < 0:
            raise ConfigError("[targets.labgrid] wait_s must be >= 0")
        if self.poll_s <= 0 or self.coordinator_timeout_s <= 0:
            raise ConfigError("[targets.labgrid] poll_s and coordinator_timeout_s must be > 0")
        for pair in filter(None, (p.strip() for p in self.tag.split(","))):
            if "=" not in pair:
                raise ConfigError(f"[targets.labgrid] tag {pair!r} is not KEY=VALUE")


LG_KEYS = {f.name for f in fields(LabgridSettings)}


def _split(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(labgrid settings, everything else: the inner target's)."""
    mine = {k: v for k, v in values.items() if str(k).replace("-", "_") in LG_KEYS}
    return mine, {k: v for k, v in values.items() if k not in mine}


def parse_tags(text: str) -> dict[str, str]:
    out = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = pair.partition("=")
        out[key.strip()] = value.strip()
    return out


def coordinator_address(settings: LabgridSettings) -> str:
    import os

    return settings.coordinator.strip() or os.environ.get("LG_COORDINATOR", "").strip() or DEFAULT_COORDINATOR


class Busy(Exception):
    """The place (or every place of the pool) is acquired by someone else."""


AGENT = Path(__file__).resolve().parent / "labgrid_agent.py"
REPO_VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv-labgrid" / "bin" / "python"
AGENT_START_TIMEOUT_S = 60.0  # the agent's start-up (importing labgrid and grpc: ~1.5 s on a loaded host)
AGENT_SLACK_S = 10.0  # beyond coordinator_timeout_s, before an agent that does not answer is killed


def _shebang_python(script: str) -> str | None:
    """The interpreter a pip-installed console script (`labgrid-client`) runs with."""
    import shutil

    try:
        with open(script, "rb") as fh:
            head = fh.read(1024).decode(errors="replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    argv = head[0][2:].split()
    if argv and argv[0] in ("/bin/sh", "/usr/bin/sh") and len(head) > 1 and head[1].startswith("'''exec' "):
        # pip's form for interpreter paths too long for a shebang: '''exec' "/path/python" "$0" "$@"
        rest = head[1][len("'''exec' "):].strip()
        argv = [rest.split('"')[1]] if rest.startswith('"') else rest.split()[:1]
    elif argv and Path(argv[0]).name == "env":
        argv = [a for a in argv[1:] if not a.startswith("-") and "=" not in a][:1]
        argv = [shutil.which(argv[0]) or ""] if argv else []
    return argv[0] if argv and argv[0] and Path(argv[0]).exists() else None


def find_labgrid_python(setting: str = "") -> tuple[str, str]:
    """(interpreter, how it was found) of the venv that has labgrid; TargetError tool-missing if none.

    `python=` / $BUNDLERUN_LABGRID_PYTHON, else the interpreter of `labgrid-client` on PATH, else
    the repository's .venv-labgrid (scripts/setup.sh)."""
    import os
    import shutil

    for value, how in ((setting, "python="), (os.environ.get("BUNDLERUN_LABGRID_PYTHON", ""),
                                              "$BUNDLERUN_LABGRID_PYTHON")):
        value = value.strip()
        if value:
            found = shutil.which(value) if os.sep not in value else (value if Path(value).exists() else None)
            if not found:
                raise TargetError(f"labgrid:// {how} {value!r} does not exist", kind=FailureKind.TOOL_MISSING.value)
            return found, how
    client = shutil.which("labgrid-client")
    if client:
        py = _shebang_python(client)
        if py:
            return py, f"shebang of {client}"
    if REPO_VENV_PYTHON.exists():
        return str(REPO_VENV_PYTHON), "the repository's .venv-labgrid"
    raise TargetError("labgrid:// needs labgrid in a venv of its own (its pyserial fork must not overwrite "
                      "bundlerun's pyserial): run scripts/setup.sh (creates .venv-labgrid), or "
                      "`python3 -m venv VENV && VENV/bin/pip install labgrid==26.0.1` and put VENV/bin on PATH "
                      "(labgrid-client) or set BUNDLERUN_LABGRID_PYTHON / python= to VENV/bin/python",
                      kind=FailureKind.TOOL_MISSING.value)


class Agent:
    """targets/labgrid_agent.py serving JSON lines, run by the labgrid venv's interpreter.

    In a session of its own (a Ctrl-C at the terminal reaches bundlerun, which then still asks it
    to release the place); it exits when its stdin closes (so also if bundlerun is SIGKILLed), and
    close() kills its process group if it does not. Every answer is awaited for a bounded time."""

    def __init__(self, python: str, how: str = ""):
        import subprocess
        import tempfile

        self.python, self.how = python, how
        self.stderr = tempfile.TemporaryFile()
        self.ids = 0
        self.buf = b""
        self.proc = None
        from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

        python = argv.program(python, "labgrid python", "labgrid://")  # argv[0]: never an option
        try:
            self.proc = subprocess.Popen([python, str(AGENT), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr, start_new_session=True, close_fds=True)
        except OSError as exc:
            self.stderr.close()
            raise TargetError(f"labgrid:// cannot start {python} ({how}): {exc}",
                              kind=FailureKind.TOOL_MISSING.value) from None
        try:
            first = self._read_line(AGENT_START_TIMEOUT_S, "starting")
            if not first.get("ok"):
                kind = first.get("kind")
                raise TargetError(f"labgrid:// {python} ({how}): {first.get('error')}",
                                  kind=FailureKind.TOOL_MISSING.value if kind == "tool-missing"
                                  else FailureKind.TRANSPORT.value)
            self.hello = first["hello"]
        except BaseException:
            self.close()
            raise

    def _stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return text.splitlines()[-1][:300] if text else ""

    def _read_line(self, timeout_s: float, what: str) -> dict:
        import json
        import os
        import select

        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(graceful=False)
                raise TargetError(f"the labgrid agent ({self.python}) did not answer {what} within {timeout_s:g}s; "
                                  "killed", kind=FailureKind.TRANSPORT.value)
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    tail = self._stderr_tail()
                    self.close()
                    raise TargetError(f"the labgrid agent ({self.python}) exited {what}"
                                      + (f": {tail}" if tail else ""), kind=FailureKind.TRANSPORT.value)
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.close(graceful=False)
            raise TargetError(f"the labgrid agent ({self.python}) answered {what} with {line[:200]!r}",
                              kind=FailureKind.TRANSPORT.value) from None

    def request(self, cmd: str, timeout_s: float, **args) -> dict:
        """The agent's answer ({"ok": ..., "result"|"kind"+"error"}) to one request."""
        import json

        if self.proc is None:
            raise TargetError("the labgrid agent is closed", kind=FailureKind.TRANSPORT.value)
        self.ids += 1
        rid = self.ids
        try:
            self.proc.stdin.write((json.dumps({"id": rid, "cmd": cmd, **args}) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            tail = self._stderr_tail()
            self.close()
            raise TargetError(f"the labgrid agent ({self.python}) is gone" + (f": {tail}" if tail else ""),
                              kind=FailureKind.TRANSPORT.value) from None
        deadline = time.monotonic() + timeout_s + AGENT_SLACK_S
        while True:  # answers to requests abandoned earlier (a Ctrl-C while waiting) come first: skipped
            answer = self._read_line(max(0.0, deadline - time.monotonic()), f"to {cmd}")
            if answer.get("id") == rid:
                return answer

    def close(self, graceful: bool = True) -> None:
        """End the agent: end of its input (it exits), then its process group killed; reaped."""
        import os
        import signal
        import subprocess

        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.stdin.close()  # the agent's end of input: it exits
            except (OSError, ValueError):
                pass
            if graceful:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind, or itself if it hung
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 2.0  # the agent's own children die (and are reaped by init) async
            while time.monotonic() < deadline:
                try:
                    os.killpg(proc.pid, 0)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.02)
            proc.stdout.close()
        try:
            self.stderr.close()
        except OSError:
            pass


@dataclass
class PlaceInfo:
    name: str
    aliases: list
    tags: dict
    acquired: str | None
    allowed: list


@dataclass
class ResourceInfo:
    avail: bool
    params: dict


class Coordinator:
    """The coordinator, as seen through the labgrid agent (one agent process for the `with`).

    Each call is one short client session in the agent (connect, ask, disconnect), bounded by
    `timeout_s`; the acquisition itself lives in the coordinator, so nothing of labgrid runs
    while the inner target does."""

    def __init__(self, address: str, timeout_s: float, python: str = ""):
        self.address, self.timeout_s, self.python = address, timeout_s, python
        self.agent: Agent | None = None

    def __enter__(self) -> "Coordinator":
        self.agent = Agent(*find_labgrid_python(self.python))
        return self

    def __exit__(self, *exc) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None

    def call(self, cmd: str, what: str, **args):
        if self.agent is None or self.agent.proc is None:  # killed after a call that did not answer: a new one
            self.agent = Agent(*find_labgrid_python(self.python))
        answer = self.agent.request(cmd, self.timeout_s, coordinator=self.address, timeout=self.timeout_s, **args)
        if answer.get("ok"):
            return answer["result"]
        kind, why = answer.get("kind"), answer.get("error", "")
        if kind == "busy":
            raise Busy(why)
        if kind == "unreachable":
            raise TargetError(
                f"cannot reach the labgrid coordinator at {self.address} ({why}); set ?coordinator=HOST:PORT, "
                "[targets.labgrid] coordinator or $LG_COORDINATOR", kind=FailureKind.TRANSPORT.value)
        if kind == "timeout":
            raise TargetError(f"labgrid coordinator {self.address}: {why} timed out after {self.timeout_s:g}s",
                              kind=FailureKind.TRANSPORT.value)
        if kind == "tool-missing":
            raise TargetError(why, kind=FailureKind.TOOL_MISSING.value)
        if kind == "not-ours":
            raise TargetError(f"labgrid place {args.get('place')} is no longer ours (acquired by {why})",
                              kind=FailureKind.TRANSPORT.value)
        raise TargetError(f"labgrid coordinator {self.address}: {what} failed: {why}", kind=FailureKind.TRANSPORT.value)

    # ---- what we ask of it --------------------------------------------------------------------
    @property
    def me(self) -> str:
        return self.agent.hello["me"]

    def places(self) -> dict[str, PlaceInfo]:
        found = self.call("places", "listing places")
        return {name: PlaceInfo(**p) for name, p in found["places"].items()}

    def place(self, name: str) -> PlaceInfo:
        places = self.places()
        if name in places:
            return places[name]
        for place in places.values():  # an alias (labgrid's own `-p` accepts them)
            if name in place.aliases:
                return place
        known = ", ".join(sorted(places)) or "none"
        raise TargetError(f"labgrid coordinator {self.address} has no place {name!r} (places: {known})",
                          kind=FailureKind.BAD_CONFIG.value)

    def acquire(self, name: str) -> None:
        self.call("acquire", f"acquiring place {name}", place=name)

    def release(self, name: str, if_ours: bool = False) -> bool:
        """Release a place we hold; `if_ours`: False (nothing done) when someone else holds it."""
        return bool(self.call("release", f"releasing place {name}", place=name, if_ours=if_ours)["released"])

    def resources(self, name: str) -> list[tuple[str, str, ResourceInfo]]:
        """(name, class, entry) of what the place holds now, as its exporter publishes it."""
        found = self.call("resolve", f"resolving place {name}", place=name)
        return [(r["name"], r["cls"], ResourceInfo(bool(r["avail"]), dict(r["params"] or {})))
                for r in found["resources"]]


def resolve_inner(place_name: str, resources: list[tuple[str, str, Any]], inner: str, want: str) -> tuple[str, dict, str]:
    """The inner target URL, config additions and the resource used, for what the place exports."""
    scheme = inner.split("://", 1)[0].lower() if inner else ""
    if inner and urlsplit(inner).netloc:
        return inner, {}, "(given)"
    serial = [(n, c, e) for n, c, e in resources if c == "NetworkSerialPort"]
    adb = [(n, c, e) for n, c, e in resources if c == "NetworkService" and n.lower().startswith("adb")]
    if want:
        serial = [r for r in serial if r[0] == want]
        adb = [r for r in adb if r[0] == want]
    if scheme in ADB_SCHEMES:
        pool = adb
    elif scheme in SERIAL_SCHEMES:
        pool = serial
    elif not scheme:
        pool = serial or adb
    else:
        raise TargetError(f"labgrid place {place_name}: inner target {inner!r} has no host and no labgrid resource "
                          f"gives one; use {', '.join(SERIAL_SCHEMES + ADB_SCHEMES)} or a full URL",
                          kind=FailureKind.BAD_CONFIG.value)
    held = ", ".join(f"{n} ({c})" for n, c, _ in resources) or "nothing"
    if not pool:
        what = "an ADB NetworkService" if scheme in ADB_SCHEMES else (
            "a NetworkSerialPort" if scheme else "a NetworkSerialPort or an ADB NetworkService")
        raise TargetError(f"labgrid place {place_name} has no {what}"
                          + (f" named {want!r}" if want else "") + f" (it holds {held}; is its exporter running?)",
                          kind=FailureKind.TRANSPORT.value)
    name, cls, entry = pool[0]
    params = dict(entry.params or {})
    if not entry.avail:
        raise TargetError(f"labgrid place {place_name}: resource {name} ({cls}) is not available on its exporter "
                          "(device unplugged?)", kind=FailureKind.TRANSPORT.value)
    query = ("?" + inner.split("?", 1)[1]) if "?" in inner else ""
    if cls == "NetworkSerialPort":
        host, port = params.get("host"), params.get("port")
        if not host or not port:
            raise TargetError(f"labgrid place {place_name}: the exporter publishes no network port for {name} yet "
                              "(ser2net not running?)", kind=FailureKind.TRANSPORT.value)
        extra: dict[str, Any] = {}
        if params.get("speed"):
            extra["baudrate"] = int(params["speed"])
        hostport = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        if params.get("protocol", "rfc2217") == "raw" or scheme == "serial+socket":
            return f"serial+socket://{hostport}{query}", extra, name
        # ser2net answers SET_CONTROL only where the tty has modem lines; labgrid's SerialDriver
        # ignores the acknowledgement for that reason, and so do we (DTR/RTS are still sent).
        extra["port"] = f"rfc2217://{hostport}?ign_set_control"
        return f"rfc2217://{hostport}{query}", extra, name
    address, port = params.get("address"), params.get("port") or 5555
    if "%" in str(address):
        raise TargetError(f"labgrid place {place_name}: {name} has a link-local address {address} that needs "
                          "labgrid's proxy; not supported", kind=FailureKind.UNSUPPORTED.value)
    hostport = f"[{address}]:{port}" if ":" in str(address) else f"{address}:{port}"
    return f"adb+tcp://{hostport}{query}", {}, name


@dataclass
class LabgridTarget(TargetBase):
    url: str
    place: str  # "" with a tag pool
    inner: str  # "" = resolve from the place's resources
    settings: LabgridSettings
    inner_config: dict[str, Any]

    @property
    def address(self) -> str:
        return coordinator_address(self.settings)

    def _coordinator(self) -> Coordinator:
        return Coordinator(self.address, self.settings.coordinator_timeout_s, self.settings.python)

    @contextmanager
    def _using(self, c: Coordinator | None):
        """`c` (the run's agent) when given, else an agent for this one step."""
        if c is not None:
            yield c
            return
        with self._coordinator() as own:
            yield own

    # ---- acquire -------------------------------------------------------------------------------
    def _candidates(self, c: Coordinator) -> list:
        if self.place:
            return [c.place(self.place)]
        tags = parse_tags(self.settings.tag)
        places = [p for p in c.places().values() if all(p.tags.get(k) == v for k, v in tags.items())]
        if not places:
            raise TargetError(f"no labgrid place on {self.address} has the tags {self.settings.tag}",
                              kind=FailureKind.BAD_CONFIG.value)
        return sorted(places, key=lambda p: (bool(p.acquired), p.name))  # free ones first

    def acquire(self, c: Coordinator | None = None) -> tuple[str, bool]:
        """The place's name, and whether we acquired it (and so must release it)."""
        s = self.settings
        deadline = time.monotonic() + s.wait_s
        with self._using(c) as c:
            while True:
                holders = []
                for place in self._candidates(c):
                    if not s.acquire:
                        if place.acquired == c.me or c.me in place.allowed:
                            return place.name, False
                        holders.append(f"{place.name} ({'acquired by ' + place.acquired if place.acquired else 'free'})")
                        continue
                    if place.acquired:
                        mine = " (you: release it, or set acquire=false to use your own acquisition)" \
                            if place.acquired == c.me else ""
                        holders.append(f"{place.name} is acquired by {place.acquired}{mine}")
                        continue
                    try:
                        c.acquire(place.name)
                        return place.name, True
                    except Busy as exc:  # someone else was faster
                        holders.append(f"{place.name}: {exc}")
                    except BaseException:  # Ctrl-C or a timeout mid-call: the coordinator may have said yes
                        self._release_if_ours(place.name, c)
                        raise
                if not s.acquire:
                    raise TargetError(f"acquire=false, but no place you hold on {self.address}: {'; '.join(holders)}",
                                      kind=FailureKind.DEVICE_BUSY.value)
                if time.monotonic() + s.poll_s > deadline:
                    what = f"labgrid place {self.place}" if self.place else f"every labgrid place tagged {s.tag}"
                    waited = f" (waited {s.wait_s:g}s)" if s.wait_s else " (set wait_s to wait for it)"
                    raise TargetError(f"{what} is busy on {self.address}{waited}: {'; '.join(holders)}",
                                      kind=FailureKind.DEVICE_BUSY.value)
                time.sleep(s.poll_s)

    def release(self, name: str, c: Coordinator | None = None) -> None:
        with self._using(c) as c:
            c.release(name)  # the agent checks it is still ours: "no longer ours (acquired by ...)" if not

    def _release_if_ours(self, name: str, c: Coordinator | None = None) -> None:
        try:
            with self._using(c) as c:
                c.release(name, if_ours=True)
        except BaseException:  # noqa: BLE001 - best effort on the way out of a failure
            pass

    def resolve(self, name: str, c: Coordinator | None = None) -> tuple[str, dict, str]:
        with self._using(c) as c:
            return resolve_inner(name, c.resources(name), self.inner, self.settings.resource)

    # ---- the run -------------------------------------------------------------------------------
    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        from bundlerun.targets import open_target  # late: looked up at call time (tests replace it)

        _, inner_opts = _split(dict(options.config or {}))
        t0 = time.monotonic()
        with self._coordinator() as c:  # one labgrid agent for the run: acquire, resolve, release
            name, ours = self.acquire(c)
            info: dict[str, Any] = {"coordinator": self.address, "place": name, "acquired_by_us": ours,
                                    "acquire_s": round(time.monotonic() - t0, 3), "labgrid_python": c.agent.python}
            run = None
            try:
                inner_url, extra, resource = self.resolve(name, c)
                info.update({"inner_target": inner_url, "resource": resource})
                cfg = {**extra, **self.inner_config, **inner_opts}
                target = open_target(inner_url, cfg)
                run = target.run(bundle, bundle_path, dataclasses.replace(options, config=cfg))
            finally:
                if ours:
                    try:
                        self.release(name, c)  # a fresh agent if the run's one died meanwhile
                        info["released"] = True
                    except BaseException as exc:  # noqa: BLE001 - a lost coordinator must not mask the run's result
                        info["released"] = False
                        warning = (f"labgrid place {name} could not be released ({exc}); release it with "
                                   f"`labgrid-client -x {self.address} -p {name} release`")
                        if run is not None:
                            run.warnings.append(warning)
                        if isinstance(exc, KeyboardInterrupt):
                            raise
        run.info = {**run.info, "labgrid": info}
        return run


# ---- declaration --------------------------------------------------------------------------------
def _doctor(section: dict) -> list[Check]:
    try:
        settings = parse_settings(LabgridSettings, _split(dict(section or {}))[0], "targets.labgrid")
    except ConfigError as exc:
        return [Check("labgrid coordinator", False, str(exc))]
    import os

    try:
        python, how = find_labgrid_python(settings.python)
        agent = Agent(python, how)
        rows = [Check("labgrid", True, f"{agent.hello['labgrid']} ({how})", python)]
        agent.close()
    except TargetError as exc:
        return [Check("labgrid", False, str(exc))]
    address = coordinator_address(settings)
    if not settings.coordinator and not os.environ.get("LG_COORDINATOR"):
        return rows + [Check("labgrid coordinator", None, "none configured ([targets.labgrid] coordinator or "
                             "$LG_COORDINATOR)")]
    try:
        with Coordinator(address, min(settings.coordinator_timeout_s, 5.0), settings.python) as c:
            n = len(c.places())
        rows.append(Check("labgrid coordinator", True, f"{n} place(s)", address))
    except TargetError as exc:
        rows.append(Check("labgrid coordinator", False, str(exc), address))
    return rows


SPEC = TargetSpec(
    name="labgrid",
    schemes=("labgrid",),
    summary="a board reserved through a labgrid coordinator (place or pool by tag): its exported serial port "
            "(RFC 2217) or network ADB becomes the inner target; released on every exit path",
    examples=("labgrid://PLACE/", "labgrid://PLACE/rfc2217://?reset=none", "labgrid://?tag=pool=ci"),
    default_backend=inner_default_backend("portable"),
    settings=LabgridSettings,
    doctor=_doctor,
    command_settings=("python",),  # the interpreter the labgrid agent runs in
    inner=path_inner_url,
    device_key=lambda url: f"board:{url.netloc}" if url.netloc else None,  # a pool by tag: whichever is free
    capture_note="needs the inner serial lane's capture run through the labgrid agent",
)


def create(url: TargetURL, config: dict) -> LabgridTarget:
    place = url.netloc
    inner = url.path.lstrip("/")
    config = dict(config or {})
    from_project = config.pop("inner_config", None) or {}  # the inner's own [targets.X] (runner/session.py)
    if not isinstance(from_project, dict):
        raise ConfigError(f"{url.raw}: inner_config must be a table of the inner target's settings")
    cfg_mine, cfg_inner = _split(config)
    cfg_inner = {**from_project, **cfg_inner}
    q_mine, q_inner = _split(dict(url.query))
    settings = parse_settings(LabgridSettings, {**cfg_mine, **q_mine}, "targets.labgrid")
    if not place and not settings.tag:
        raise ConfigError(f"{url.raw}: no place; expected labgrid://PLACE/[inner URL] or labgrid://?tag=KEY=VALUE")
    if place and settings.tag:
        raise ConfigError(f"{url.raw}: give a place or tag=..., not both")
    if inner:
        if "://" not in inner:
            raise ConfigError(f"{url.raw}: inner target {inner!r} is not a URL (e.g. rfc2217://, adb+tcp://)")
        if inner.lower().startswith("labgrid://"):
            raise ConfigError(f"{url.raw}: labgrid:// inside labgrid:// is not supported")
        if urlsplit(inner).netloc:
            parse_target_url(inner)  # a full inner URL: its scheme must be known here
        elif inner.split("://", 1)[0].lower() not in SERIAL_SCHEMES + ADB_SCHEMES:
            raise ConfigError(f"{url.raw}: inner target {inner!r} has no host; only "
                              f"{', '.join(SERIAL_SCHEMES + ADB_SCHEMES)} are filled in from the place's resources")
    return LabgridTarget(url.raw, place, inner, settings, {**cfg_inner, **q_inner})
