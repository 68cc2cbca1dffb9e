"""`ssh://[user@]host[:port]/<inner target URL>`: any target's worker on another machine.

    bundlerun run X.bpte --target ssh://mac.local/host://xnnpack
    bundlerun run X.bpte --target 'ssh://ci@10.0.0.5:2222/mlx://gpu?bundlerun=~/venv/bin/bundlerun'

Steps, each with its own timeout: connect (one ControlMaster connection of the system
`ssh`, host key verified, key auth), version check (the remote `bundlerun --version`
must equal this one), push (the bundle into the content-addressed device cache of
targets/remote/device_cache.py: sent once per content, verified by sha256), setup (the
remote `bundlerun worker` opens the inner target and says ready), then per case.
Results stream back as JSON lines with the raw outputs inline; judging happens here,
with the bundle's criteria, as for every target.

A dropped connection makes the in-flight case an ERROR (`transport`); the rest go on
over a new connection, or, if none can be made, are marked `not-run` naming the cause.
The remote worker exits and kills everything it started when its session ends.

Query keys that are ssh:// settings (below) stay here; every other key goes to the
inner target's URL (checked against that target's declared settings).
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlencode

from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets import Check, TargetSpec, TargetURL, inner_default_backend, path_inner_url
from bundlerun.targets.base import CaseResult, CaseStatus, RunOptions, TargetBase, TargetRun, safe_name, selected_cases
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.settings import did_you_mean, parse_settings
from bundlerun.targets.workers.protocol import Buffer, Ending, EventDriver, Limits, tail_lines as _tail
from bundlerun._version import __version__
from bundlerun.targets import parse_target_url, target_specs
from bundlerun.targets.process import kill_process_group

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle
    from bundlerun.targets.remote.ssh_transport import SshTransport

MAX_RECONNECTS = 3


@dataclass
class SshSettings:
    """[targets.ssh] / ssh://HOST/INNER?key=value"""

    identity_file: Path | None = None  # private key (-i); default: ssh's own (config, agent, ~/.ssh/id_*)
    known_hosts: Path | None = None  # known_hosts file to verify the host key with (default: ssh's own)
    ssh_config: Path | None = None  # ssh config file (-F); default ~/.ssh/config
    fingerprint: str = ""  # pin the host key instead: SHA256:... as `ssh-keygen -lf` prints it
    bundlerun: str = "bundlerun"  # the remote bundlerun command (e.g. ~/venv/bin/bundlerun)
    workspace: str = "~/.cache/bundlerun/ssh"  # remote folder: device cache + scratch
    env: dict[str, str] = field(default_factory=dict)  # environment of the remote worker (K=V,K=V)
    connect_timeout: float = 15.0  # s: TCP + handshake + authentication
    command_timeout: float = 60.0  # s: each small remote command (version, cache check, mkdir)
    push_timeout: float = 300.0  # s: sending the bundle
    setup_timeout: float = 0.0  # s until the remote worker is ready (0: the run's --setup-timeout)
    case_timeout: float = 0.0  # s the link waits for one case's result (0: the run's case + setup timeouts)
    multiplex: bool = True  # one ControlMaster connection for every command
    cache_max_mb: int = 0  # prune the remote cache to this size after a run (0: never)
    ssh: str = "ssh"  # the ssh client binary
    ssh_options: list[str] = field(default_factory=list)  # extra -o options (Key=Value,Key=Value)

    def validate(self) -> None:
        for name in ("connect_timeout", "command_timeout", "push_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"[targets.ssh] {name} must be > 0 seconds")
        for name in ("setup_timeout", "case_timeout"):
            if getattr(self, name) < 0:
                raise ConfigError(f"[targets.ssh] {name} must be >= 0 seconds (0: the run's own)")
        if not self.bundlerun.strip():
            raise ConfigError("[targets.ssh] bundlerun must name the remote bundlerun command")


SSH_KEYS = {f.name for f in fields(SshSettings)}


def split_url(url: TargetURL) -> tuple[str | None, str, int | None, str, dict[str, str], dict[str, str]]:
    """user, host, port, inner URL (with its own query), ssh settings, inner settings."""
    netloc = url.netloc
    user, _, hostport = netloc.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):  # [v6]:port
        end = hostport.find("]")
        host, rest = hostport[1:end], hostport[end + 1:]
        port = rest[1:] if rest.startswith(":") else None
    elif ":" in hostport:
        host, port = hostport.rsplit(":", 1)
    if not host:
        raise TargetError(f"{url.raw}: no host; expected ssh://[user@]host[:port]/<inner target URL>", kind=FailureKind.BAD_CONFIG)
    from bundlerun.targets import argv  # start-up: not loaded by `bundlerun --help`

    # host and user reach ssh's argv: `ssh://-oProxyCommand=.../...` must never be an ssh option
    host = argv.host(host, "ssh host", url.raw)
    port_n = argv.port(port, "ssh port", url.raw) if port else None
    if user:
        argv.user(unquote(user), "ssh user", url.raw)
    inner = url.path.lstrip("/")
    if "://" not in inner:
        raise TargetError(f"{url.raw}: no inner target; expected ssh://[user@]host[:port]/<inner URL>, "
                          "e.g. ssh://mac.local/host://xnnpack", kind=FailureKind.BAD_CONFIG)
    ssh_q = {k: v for k, v in url.query.items() if k.replace("-", "_") in SSH_KEYS}
    inner_q = {k: v for k, v in url.query.items() if k.replace("-", "_") not in SSH_KEYS}
    return (unquote(user) or None), host, port_n, inner, ssh_q, inner_q


def _check_inner(inner: str, inner_q: dict[str, str], raw: str) -> str:
    """The inner URL with its query; its scheme and keys checked here, before connecting."""

    if inner.lower().startswith("ssh://"):
        raise TargetError(f"{raw}: ssh:// inside ssh:// is not supported", kind=FailureKind.BAD_CONFIG)
    parsed = parse_target_url(inner)
    spec = target_specs()[parsed.scheme]
    known = set(f.name for f in fields(spec.settings)) if spec.settings else set()
    for key in {**parsed.query, **inner_q}:
        if key.replace("-", "_") not in known:
            raise ConfigError(f"{raw}: unknown setting {key!r}{did_you_mean(key, SSH_KEYS | known)}; ssh:// knows "
                              f"{', '.join(sorted(SSH_KEYS))}; {spec.name}:// knows {', '.join(sorted(known)) or 'none'}")
    base = inner.split("?", 1)[0]
    query = {**parsed.query, **inner_q}
    return base + (f"?{urlencode(query)}" if query else "")


def _kind(transport_kind: str) -> FailureKind:
    """SSH's own faults first (credentials, host key, no ssh client), then any transport fault's."""
    from bundlerun.targets.remote.ssh_transport import HOST_KEY  # start-up: not loaded by `bundlerun --help`
    from bundlerun.targets.remote.transport import ABSENT, UNAUTHORIZED, failure_kind  # start-up: not loaded by `bundlerun --help`

    return {UNAUTHORIZED: FailureKind.AUTH_REFUSED, HOST_KEY: FailureKind.HOST_KEY,
            ABSENT: FailureKind.TOOL_MISSING}.get(transport_kind) or failure_kind(transport_kind)


@dataclass
class SshTarget(TargetBase):
    url: str
    user: str | None
    host: str
    port: int | None
    inner: str
    settings: SshSettings
    inner_config: dict = field(default_factory=dict)  # the inner target's [targets.X] section, sent to the worker
    timings: dict[str, float] = field(default_factory=dict)
    _unreaped: list[str] = field(default_factory=list)  # session ids whose remote processes may linger

    @property
    def _where(self) -> str:
        return f"ssh://{self.user + '@' if self.user else ''}{self.host}{f':{self.port}' if self.port else ''}"

    def transport(self) -> "SshTransport":
        from bundlerun.targets.remote.ssh_transport import SshTransport  # start-up: not loaded by `bundlerun --help`

        s = self.settings
        return SshTransport(self.host, self.user, self.port, s.identity_file, s.known_hosts, s.ssh_config,
                            s.fingerprint, s.connect_timeout, s.multiplex, s.ssh, list(s.ssh_options))

    # ---- the run --------------------------------------------------------------------------
    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        from bundlerun.targets.remote.device_cache import Artifact, DeviceCache  # start-up: not loaded by `bundlerun --help`
        from bundlerun.targets.remote.transport import TransportError  # start-up: not loaded by `bundlerun --help`

        s = self.settings
        t = self.transport()
        info: dict = {"inner_target": self.inner, "ssh": t.description}
        start = time.perf_counter()
        try:
            step = time.perf_counter()
            self._step(t.connect, "connecting")
            self.timings["connect_s"] = time.perf_counter() - step
            step = time.perf_counter()
            remote_version = self._check_version(t)
            self.timings["version_check_s"] = time.perf_counter() - step
            step = time.perf_counter()
            workspace = self._step(lambda: self._workspace(t), "preparing the remote workspace")
            cache = DeviceCache(t, workspace, s.command_timeout, s.push_timeout)
            art = Artifact(Path(bundle_path), safe_name(Path(bundle_path).name))
            remote_bundle = self._step(lambda: cache.ensure([art])[art.name], "pushing the bundle")
            self.timings["push_s"] = time.perf_counter() - step
            info.update({"remote_bundlerun": remote_version, "remote_bundle": remote_bundle,
                         "bundle_pushed": bool(cache.pushed), "remote_workspace": workspace})
            pairs = selected_cases(bundle, options)
            cases, worker_info, warnings, setup_s = self._run_cases(t, remote_bundle, workspace, pairs, options)
            info.update(worker_info)
            if s.cache_max_mb > 0 and t.alive():
                try:
                    cache.prune(s.cache_max_mb * 1024 * 1024, cache.used)
                except TransportError as exc:
                    warnings.append(f"{t.description}: pruning the remote cache failed: {exc}")
        finally:
            t.close()
        info["timings"] = {k: round(v, 4) for k, v in self.timings.items()}
        run = TargetRun(self.url, cases, info=info, logs={p.stem: str(p) for p in
                                                        sorted(Path(options.work_dir).glob("ssh-worker-*.log"))},
                        setup_s=setup_s, warnings=warnings)
        run.info["wall_s"] = time.perf_counter() - start
        return run

    def _step(self, fn, what: str):
        from bundlerun.targets.remote.transport import TransportError  # start-up: not loaded by `bundlerun --help`

        try:
            return fn()
        except TransportError as exc:
            message = str(exc)
            if not message.startswith("ssh://"):
                message = f"{self._where}: {what}: {message}"
            raise TargetError(message, kind=_kind(exc.kind).value) from None

    def _check_version(self, t) -> str:
        from bundlerun.targets.remote.ssh_transport import parse_version  # start-up: not loaded by `bundlerun --help`

        cmd = f"{self.settings.bundlerun} --version"
        res = self._step(lambda: t.run(cmd, self.settings.command_timeout), "checking the remote bundlerun")
        text = (res.stdout + res.stderr).strip()
        if res.returncode == 127 or "not found" in text.lower() and res.returncode != 0:
            raise TargetError(f"{t.description}: remote bundlerun not found: `{cmd}` failed "
                              f"({text.splitlines()[-1] if text else f'exit {res.returncode}'}); install bundlerun "
                              f"{__version__} there or set ?bundlerun=/path/to/bundlerun", kind=FailureKind.TOOL_MISSING)
        version = parse_version(res.stdout)
        if res.returncode != 0 or version is None:
            raise TargetError(f"{t.description}: `{cmd}` did not print a version (exit {res.returncode}: "
                              f"{text.splitlines()[-1] if text else 'no output'})", kind=FailureKind.TOOL_MISSING)
        if version != __version__:
            raise TargetError(f"{t.description}: remote bundlerun is {version}, local is {__version__}; "
                              f"install bundlerun {__version__} there (`{self.settings.bundlerun}`)",
                              kind=FailureKind.VERSION_MISMATCH)
        return version

    def _workspace(self, t) -> str:
        from bundlerun.targets.remote.ssh_transport import remote_path_expr  # start-up: not loaded by `bundlerun --help`
        from bundlerun.targets.remote.transport import check_shell  # start-up: not loaded by `bundlerun --help`

        expr = remote_path_expr(self.settings.workspace)
        out = check_shell(t, f"mkdir -p {expr} && cd {expr} && pwd -P", self.settings.command_timeout,
                          f"creating the workspace {self.settings.workspace}")
        lines = [ln for ln in out.splitlines() if ln.startswith("/")]
        if not lines:
            raise TargetError(f"{t.description}: could not resolve the workspace {self.settings.workspace} "
                              f"(got {out.strip()[:200]!r})", kind=FailureKind.TRANSPORT)
        return lines[-1]

    # ---- the worker session -----------------------------------------------------------------
    def _worker_command(self, remote_bundle: str, workspace: str, options: RunOptions, session_id: str) -> str:
        s = self.settings
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items() if k.isidentifier())
        parts = [f"exec env {env}" if env else "exec", s.bundlerun, "worker", "--target", shlex.quote(self.inner),
                 "--case-timeout", f"{options.case_timeout_s:g}", "--setup-timeout", f"{options.setup_timeout_s:g}",
                 "--expect-version", shlex.quote(__version__), "--work-dir", shlex.quote(workspace + "/runs"),
                 "--session", session_id]
        if self.inner_config:  # checked by the inner target on the remote side, like a local config
            parts += ["--config-json", shlex.quote(json.dumps(self.inner_config, default=str))]
        return " ".join([*parts, shlex.quote(remote_bundle)])

    def _run_cases(self, t, remote_bundle: str, workspace: str, pairs: list[tuple[str, int]], options: RunOptions):
        from bundlerun.targets.remote.transport import TransportError  # start-up: not loaded by `bundlerun --help`

        results: dict[tuple[str, int], CaseResult] = {}
        info: dict = {}
        warnings: list[str] = []
        setup_s = 0.0
        attempt = 0
        while True:
            remaining = [p for p in pairs if p not in results]
            if not remaining:
                break
            attempt += 1
            log_path = Path(options.work_dir) / f"ssh-worker-{attempt}.log"
            outcome, session = self._session(t, remote_bundle, workspace, remaining, options, log_path, results)
            info.update(session.get("info", {}))
            warnings += [w for w in session.get("warnings", []) if w not in warnings]
            setup_s += session.get("setup_s", 0.0) or 0.0
            remaining = [p for p in pairs if p not in results]
            if outcome in ("fatal", "finished") or not remaining:
                break
            # the session ended early (link dropped, worker died, timed out): a new one for the rest
            if attempt > MAX_RECONNECTS:
                self._mark(results, remaining, f"not run: the remote worker session failed {attempt} times",
                           FailureKind.NOT_RUN)
                break
            try:
                if outcome == "link-lost" or not t.alive():
                    t.reconnect()
                    self._reap(t)
            except TransportError as exc:
                self._mark(results, remaining, f"not run: the SSH connection was lost and could not be re-established "
                           f"({exc})", FailureKind.NOT_RUN)
                break
        for p in pairs:
            if p not in results:
                self._mark(results, [p], "not run: the remote worker ended without a result for this case",
                           FailureKind.INCOMPLETE)
        return [results[p] for p in pairs], info, warnings, setup_s

    def _mark(self, results, pairs, error: str, kind: FailureKind) -> None:
        for m, c in pairs:
            results.setdefault((m, c), CaseResult(m, c, CaseStatus.ERROR, error=error, error_kind=kind))

    def _session(self, t, remote_bundle, workspace, pairs, options: RunOptions, log_path: Path, results: dict):
        """One remote worker over one SSH channel. Returns (outcome, finished-event fields)."""

        s = self.settings
        options.work_dir.mkdir(parents=True, exist_ok=True)
        setup_limit = s.setup_timeout or options.setup_timeout_s
        case_limit = s.case_timeout or (options.case_timeout_s + options.setup_timeout_s)
        session_id = "brs-" + secrets.token_hex(6)
        with open(log_path, "wb") as log:
            proc = t.popen(self._worker_command(remote_bundle, workspace, options, session_id), stderr=log)
        session: dict = {}
        try:
            proc.stdin.write((json.dumps({"cases": [[m, c] for m, c in pairs]}) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # the worker is already gone: the read loop says why
        try:
            outcome = self._drive(proc, pairs, options, log_path, results, session, setup_limit, case_limit, t)
        finally:
            try:
                proc.stdin.close()  # the remote worker's cue to kill everything and exit
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            kill_process_group(proc, 2.0, term_first=False)
            proc.stdout.close()
        if outcome not in ("finished", "fatal") or proc.returncode not in (0, 3):
            self._unreaped.append(session_id)
        self._reap(t)
        return outcome, session

    def _reap(self, t) -> None:
        """Kill what is left of ended sessions on the remote host: normally the worker has already
        exited on its own when its stdin closed; this covers a worker that never started reading it
        (a slow or wedged start). Found by the session id in its argv, killed by process group
        (TERM, then KILL); best effort, over a live connection only."""
        if not self._unreaped or not t.alive():
            return
        ids = list(self._unreaped)
        pattern = "|".join(ids)
        script = (f"groups=$(ps -A -o pgid= -o args= 2>/dev/null | grep -E -- '{pattern}' | grep -v grep | "
                  "awk '{print $1}' | sort -u); [ -z \"$groups\" ] && exit 0; "
                  "for g in $groups; do kill -TERM -$g 2>/dev/null; done; sleep 1; "
                  "for g in $groups; do kill -KILL -$g 2>/dev/null; done; exit 0")  # dash: no `--`
        try:
            t.run(script, self.settings.command_timeout)
            self._unreaped = [i for i in self._unreaped if i not in ids]
        except Exception:  # noqa: BLE001 - housekeeping; the worker's own stdin watch is the main guard
            pass

    def _drive(self, proc, pairs, options, log_path, results, session, setup_limit, case_limit, t) -> str:
        """The remote worker's event stream (targets/workers/protocol.py, outputs inline) -> results.
        A lost link is `transport`, a remote worker that died `crash`; either way a new session
        takes the remaining cases."""

        def gone(ready: bool) -> tuple[FailureKind, str, dict]:
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            lost = proc.returncode == 255 or not t.alive()
            why = "the SSH connection was lost" if lost else f"the remote worker exited (exit code {proc.returncode})"
            tail = _tail(log_path)
            if tail and lost:
                why += f": {tail[-1]}"
            session["lost"] = lost
            if not ready:
                return (FailureKind.TRANSPORT if lost else FailureKind.TOOL_FAILED,
                        f"{t.description}: {why} before the remote worker was ready", {})
            return (FailureKind.TRANSPORT if lost else FailureKind.CRASH, f"{t.description}: {why} while running this case",
                    {"transport_fault": "connection-lost" if lost else "worker-exit"})

        driver = EventDriver(
            list(pairs), results, log_path,
            Limits(setup_s=setup_limit, case_s=case_limit, first_case_extra_s=setup_limit),
            Ending(not_ready=lambda s: f"{t.description}: the remote worker was not ready within {s:g} s (setup "
                                       "timeout; session killed)",
                   case_silent=lambda s: f"{t.description}: no result for this case within {s:g} s (link timeout; "
                                         "remote session killed)",
                   gone=gone, fatal_kind=FailureKind.TOOL_FAILED),
            progress=options.progress, result_extra={"remote": True})
        outcome = driver.run(proc.stdout.fileno(), Buffer())
        if driver.ready_after_s is not None:
            self.timings["worker_ready_s"] = driver.ready_after_s
        for result in results.values():  # the remote side cannot name the link it came over
            if result.error_kind is FailureKind.VERSION_MISMATCH and not (result.error or "").startswith(t.description):
                result.error = f"{t.description}: {result.error}"
        session["info"] = dict(driver.info)
        session.update(driver.finished)
        if outcome == "gone":
            return "link-lost" if session.get("lost") else "worker-lost"
        return outcome

    @staticmethod
    def _notify(result: CaseResult, options: RunOptions) -> None:
        if options.progress:
            options.progress(result)


# ---- declaration --------------------------------------------------------------------------------
def _doctor(section: dict) -> list[Check]:
    import shutil

    rows = []
    for tool, pkg in (("ssh", "openssh-client"), ("ssh-keyscan", "openssh-client"), ("ssh-keygen", "openssh-client")):
        where = shutil.which(tool)
        rows.append(Check(tool, bool(where), "found" if where else f"not found (apt install {pkg})", where or ""))
    return rows


SPEC = TargetSpec(
    name="ssh",
    schemes=("ssh",),
    summary="any target on another machine over SSH (system OpenSSH: known_hosts, keys, ~/.ssh/config); "
            "the remote bundlerun worker streams raw outputs back, judged here",
    examples=("ssh://mac.local/host://xnnpack", "ssh://user@host:2222/mlx://gpu"),
    default_backend=inner_default_backend("xnnpack"),
    settings=SshSettings,
    doctor=_doctor,
    # the local client and its options (a ProxyCommand runs here), the remote command and its environment
    command_settings=("ssh", "ssh_options", "ssh_config", "bundlerun", "env"),
    inner=path_inner_url,  # farm device, lowering and elapsed clock are the inner target's
    capture_note="needs the remote worker to run the inner target's intermediate capture and ship the arrays back",
)


def create(url: TargetURL, config: dict) -> SshTarget:
    user, host, port, inner, ssh_q, inner_q = split_url(url)
    config = dict(config)
    inner_config = config.pop("inner_config", None) or {}  # the inner's [targets.X] (runner.session)
    if not isinstance(inner_config, dict):
        raise ConfigError(f"{url.raw}: inner_config must be a table of the inner target's settings")
    settings = parse_settings(SshSettings, {**config, **ssh_q}, "targets.ssh")
    inner_url = _check_inner(inner, inner_q, url.raw)
    return SshTarget(url.raw, user, host, port, inner_url, settings, inner_config)
