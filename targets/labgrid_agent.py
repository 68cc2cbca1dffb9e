"""labgrid's client, out of bundlerun's process: run by the interpreter of a venv that has labgrid.

    <labgrid python> labgrid_agent.py places  --coordinator HOST:PORT [--timeout S]
    <labgrid python> labgrid_agent.py acquire --coordinator HOST:PORT PLACE
    <labgrid python> labgrid_agent.py resolve --coordinator HOST:PORT PLACE
    <labgrid python> labgrid_agent.py release --coordinator HOST:PORT PLACE [--if-ours]
    <labgrid python> labgrid_agent.py serve       # JSON lines: {"id", "cmd", "coordinator", "timeout", "place", ...}

One command prints one JSON object on stdout: {"ok": true, "result": ...} or
{"ok": false, "kind": KIND, "error": TEXT}, KIND one of tool-missing, unreachable, timeout,
busy, not-ours, failed, bad-request. `serve` first prints {"ok": true, "hello": {...}} (or the
tool-missing error) and then answers each request line with one line carrying the request's id;
it exits at end of input. Each command opens its own client session, every coordinator call
bounded by the timeout.

Only the standard library and labgrid: labgrid's pyserial fork installs over pyserial's `serial`,
so labgrid lives in a venv of its own (scripts/setup.sh: .venv-labgrid) and bundlerun
(targets/labgrid.py) talks to it through this script. It must not import bundlerun.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import warnings

# Run as a script, its own folder (bundlerun's targets/, which has a labgrid.py) heads sys.path:
# drop it, so `import labgrid` is the labgrid package.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

OUT = None  # the real stdout (file object); sys.stdout goes to stderr so a stray print cannot corrupt the protocol


class AgentError(Exception):
    def __init__(self, kind: str, error: str):
        super().__init__(error)
        self.kind, self.error = kind, error


def _why(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            text = details()
            if text:
                return text.splitlines()[0]
        except Exception:  # noqa: BLE001
            pass
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _import_labgrid():
    try:
        import labgrid  # noqa: F401
        from labgrid.remote.client import ClientSession  # noqa: F401
        from labgrid.remote.generated import labgrid_coordinator_pb2  # noqa: F401
        from labgrid.util.proxy import proxymanager  # noqa: F401
    except ImportError as exc:
        raise AgentError("tool-missing", f"labgrid is not importable by {sys.executable} ({exc}); "
                                         "pip install labgrid==26.0.1 into that venv") from None


def hello() -> dict:
    from importlib import metadata

    _import_labgrid()
    try:
        version = metadata.version("labgrid")
    except metadata.PackageNotFoundError:
        version = "unknown"
    from socket import gethostname
    from getpass import getuser

    me = f"{os.environ.get('LG_HOSTNAME', gethostname())}/{os.environ.get('LG_USERNAME', getuser())}"
    return {"labgrid": version, "python": sys.executable, "pid": os.getpid(), "me": me}


class Session:
    """One labgrid ClientSession on a fresh event loop; every coordinator call bounded."""

    def __init__(self, address: str, timeout: float):
        self.address, self.timeout = address, timeout
        self.loop = asyncio.new_event_loop()
        self.session = None

    def call(self, coro, what: str):
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, self.timeout))
        except asyncio.TimeoutError:
            raise AgentError("timeout", what) from None
        except AgentError:
            raise
        except Exception as exc:  # noqa: BLE001 - grpc / labgrid errors: one classified message
            raise AgentError("unreachable" if what == "connecting" else "failed", _why(exc)) from None

    def __enter__(self) -> "Session":
        from labgrid.remote.client import ClientSession
        from labgrid.util.proxy import proxymanager

        try:
            asyncio.set_event_loop(self.loop)  # grpc.aio binds the channel to the current loop
            address = proxymanager.get_grpc_address(self.address, default_port=20408)
            self.session = ClientSession(address, self.loop)
            self.call(self.session.start(), "connecting")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.session is not None:
            for step in (self.session.stop, self.session.close):
                try:
                    self.loop.run_until_complete(asyncio.wait_for(step(), 5))
                except BaseException:  # noqa: BLE001 - tearing down a dead link must not mask the answer
                    pass
            self.session = None
        try:
            self.loop.close()
        except Exception:  # noqa: BLE001
            pass
        asyncio.set_event_loop(None)

    @property
    def me(self) -> str:
        return f"{self.session.gethostname()}/{self.session.getuser()}"

    def place(self, name: str):
        place = self.session.places.get(name)
        if place is None:
            raise AgentError("failed", f"no place {name!r}")
        return place


def _place_dict(place) -> dict:
    return {"name": place.name, "aliases": sorted(a.split(":", 1)[-1] for a in place.aliases),
            "tags": dict(place.tags), "acquired": place.acquired or None, "allowed": sorted(place.allowed)}


def cmd_places(s: Session, req: dict) -> dict:
    return {"me": s.me, "places": {name: _place_dict(p) for name, p in s.session.places.items()}}


def cmd_acquire(s: Session, req: dict) -> dict:
    import grpc
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    name = req["place"]

    async def go():
        try:
            await s.session.stub.AcquirePlace(pb2.AcquirePlaceRequest(placename=name))
        except grpc.aio.AioRpcError as exc:
            text = exc.details() or ""
            # already acquired, its resources held by another place, or reserved for someone else
            if (exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "valid session" not in text) or \
                    (exc.code() == grpc.StatusCode.PERMISSION_DENIED and "reserved" in text):
                raise AgentError("busy", text) from None
            raise
        await s.session.sync_with_coordinator()

    s.call(go(), f"acquiring place {name}")
    return {"place": name, "acquired": s.place(name).acquired}


def cmd_release(s: Session, req: dict) -> dict:
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    name = req["place"]
    holder = s.place(name).acquired
    if holder != s.me:
        if req.get("if_ours"):
            return {"place": name, "released": False, "acquired": holder or None}
        raise AgentError("not-ours", holder or "nobody")

    async def go():
        await s.session.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=name))
        await s.session.sync_with_coordinator()

    s.call(go(), f"releasing place {name}")
    return {"place": name, "released": True, "acquired": s.place(name).acquired or None}


def cmd_resolve(s: Session, req: dict) -> dict:
    """What the place holds now, as its exporters publish it: a serial port (NetworkSerialPort:
    the exporter's ser2net, host/port/speed/protocol) or a NetworkService (address/port)."""
    place = s.place(req["place"])
    out = []
    for path in place.acquired_resources:
        exporter, group, cls, rname = path
        match = place.getmatch(path)
        entry = s.session.resources.get(exporter, {}).get(group, {}).get(rname)
        if entry is None:
            continue
        params = {k: v for k, v in dict(entry.params or {}).items() if k != "extra"}
        out.append({"name": match.rename if match is not None and match.rename else rname, "cls": cls,
                    "avail": bool(entry.avail), "params": json.loads(json.dumps(params, default=str)),
                    "path": "/".join(path)})
    return {"place": place.name, "acquired": place.acquired or None, "resources": out}


COMMANDS = {"places": cmd_places, "acquire": cmd_acquire, "release": cmd_release, "resolve": cmd_resolve}


def handle(req: dict) -> dict:
    try:
        cmd = req.get("cmd")
        if cmd == "hello":
            return {"ok": True, "result": hello()}
        if cmd not in COMMANDS:
            raise AgentError("bad-request", f"unknown command {cmd!r} (known: hello, {', '.join(COMMANDS)})")
        if cmd != "places" and not req.get("place"):
            raise AgentError("bad-request", f"{cmd} needs a place")
        address = str(req.get("coordinator") or "").strip()
        if not address:
            raise AgentError("bad-request", "no coordinator address")
        _import_labgrid()
        with Session(address, float(req.get("timeout") or 15.0)) as s:
            return {"ok": True, "result": COMMANDS[cmd](s, req)}
    except AgentError as exc:
        return {"ok": False, "kind": exc.kind, "error": exc.error}
    except Exception as exc:  # noqa: BLE001 - a bug or a labgrid surprise: still one JSON answer
        return {"ok": False, "kind": "failed", "error": f"{type(exc).__name__}: {_why(exc)}"}


def emit(obj: dict) -> None:
    OUT.write(json.dumps(obj) + "\n")
    OUT.flush()


def serve() -> int:
    try:
        emit({"ok": True, "hello": hello()})
    except AgentError as exc:
        emit({"ok": False, "kind": exc.kind, "error": exc.error})
        return 3
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            emit({"ok": False, "kind": "bad-request", "error": f"not a JSON object: {exc}", "id": None})
            continue
        emit({**handle(req), "id": req.get("id")})
    return 0


def main(argv: list[str] | None = None) -> int:
    global OUT
    OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(prog="labgrid_agent.py")
    ap.add_argument("cmd", choices=["serve", "hello", *COMMANDS])
    ap.add_argument("place", nargs="?", default="")
    ap.add_argument("--coordinator", default=os.environ.get("LG_COORDINATOR", ""))
    ap.add_argument("--timeout", type=float, default=15.0)
    ap.add_argument("--if-ours", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve()
    answer = handle({"cmd": args.cmd, "place": args.place, "coordinator": args.coordinator,
                     "timeout": args.timeout, "if_ours": args.if_ours})
    emit(answer)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":  # run by labgrid's own Python, where bundlerun is not installed: nothing of ours here
    sys.exit(main())
