"""`fvp://` target: run a bundle on an Arm Corstone FVP with ExecuTorch's arm_executor_runner.

    fvp://corstone-300/ethos-u55-128   FVP_Corstone_SSE-300_Ethos-U55
    fvp://corstone-300/ethos-u65-256   FVP_Corstone_SSE-300_Ethos-U65
    fvp://corstone-320/ethos-u85-256   FVP_Corstone_SSE-320
    fvp://corstone-300/cortex-m55      FVP_Corstone_SSE-300_Ethos-U55 (NPU idle)
    fvp://corstone-320/cortex-m85      FVP_Corstone_SSE-320 (NPU idle)

Default mode is semihosting: the stock runner verifies test case 0 only, so each
case gets its own working directory holding a bundle whose case 0 is that case,
and the runner writes every output's raw bytes to `out-<i>.bin` there (`-o out`).
UART mode (`mode = "uart"`) runs a runner with the bundle linked in (or placed
with `--data FILE@ADDR`) and takes outputs from the ETDump block, or from the
6-decimal `Output[i][j]` lines (marked lossy).

The FVP's exit code is unreliable; every run is judged from its log
(targets.runner_log). The FVP runs in its own process group under a host
wall-clock bound on top of its own `--timelimit`; the whole group is killed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundles.bpte import Bundle, serialize_bundle
from bundles.errors import ConfigError, TargetError
from targets.process import kill_process_group
from targets.base import (
    CaseResult,
    CaseStatus,
    RawTensor,
    RunOptions,
    TargetRun,
    expected_layout,
    raw_outputs_from_files,
    selected_cases,
)
from targets.runner_log import FAULT_RE, IncrementalLogParser, RunnerLog

FVP_300_U55 = "FVP_Corstone_SSE-300_Ethos-U55"
FVP_300_U65 = "FVP_Corstone_SSE-300_Ethos-U65"
FVP_320 = "FVP_Corstone_SSE-320"
FVP_BINARIES = (FVP_300_U55, FVP_300_U65, FVP_320)

SEMIHOSTING_CMDLINE_MAX = 256  # the FVP truncates the semihosting command line past this
DUMMY_INPUT = "dummy.bin"  # '-i' is mandatory even for a bundle; 4 bytes are enough
BUNDLE_NAME = "model.bpte"
OUTPUT_BASENAME = "out"

_VALID_MACS = {"ethos-u55": (32, 64, 128, 256), "ethos-u65": (256, 512), "ethos-u85": (128, 256, 512, 1024, 2048)}
_OUT_RE = re.compile(r"^out-(\d+)\.bin$")
# Runner lines that a *numerical* mismatch of case 0 produces on its own: the
# stock runner asserts model_ok after a failed verification. They are the
# device's verdict, not an infrastructure error.
_VERIFY_FAIL_MARKERS = (
    "don't match expected BundleIO bpte ref data",
    "Test_result: FAIL",
    "Bundle verification failed with status",
    "Problem running model",
)


@dataclass(frozen=True)
class Variant:
    """One FVP platform + processor configuration."""

    key: str  # "corstone-300/ethos-u55-128"
    board: str  # "corstone-300" | "corstone-320"
    processor: str  # "ethos-u55" | "ethos-u65" | "ethos-u85" | "cortex-m55" | "cortex-m85"
    num_macs: int
    fvp: str  # binary name

    @property
    def has_npu(self) -> bool:
        return self.processor.startswith("ethos-u")

    @property
    def build_target(self) -> str:
        """The `--target=` of ExecuTorch's build_executor_runner.sh."""
        return f"{self.processor}-{self.num_macs}" if self.has_npu else self.processor


def parse_variant(netloc: str, path: str) -> Variant:
    """`corstone-300` + `/ethos-u55-128` -> Variant; a clear error otherwise."""
    board = netloc.lower()
    proc = path.strip("/").lower()
    key = f"{board}/{proc}"
    examples = "corstone-300/ethos-u55-128, corstone-300/ethos-u65-256, corstone-320/ethos-u85-256, corstone-300/cortex-m55, corstone-320/cortex-m85"
    if board not in ("corstone-300", "corstone-320"):
        raise TargetError(f"unknown FVP platform {board!r} in fvp://{key}; expected one of {examples}")
    if proc in ("cortex-m55", "cortex-m85"):
        want = "corstone-300" if proc == "cortex-m55" else "corstone-320"
        if board != want:
            raise TargetError(f"{proc} lives on {want}, not {board}: use fvp://{want}/{proc}")
        return Variant(key, board, proc, 128, FVP_300_U55 if proc == "cortex-m55" else FVP_320)
    m = re.fullmatch(r"(ethos-u55|ethos-u65|ethos-u85)-(\d+)", proc)
    if not m:
        raise TargetError(f"unknown FVP processor {proc!r} in fvp://{key}; expected one of {examples}")
    npu, macs = m.group(1), int(m.group(2))
    if macs not in _VALID_MACS[npu]:
        raise TargetError(f"{npu} has no {macs}-MAC configuration; valid: {', '.join(map(str, _VALID_MACS[npu]))}")
    fvp = {"ethos-u55": FVP_300_U55, "ethos-u65": FVP_300_U65, "ethos-u85": FVP_320}[npu]
    want = "corstone-320" if npu == "ethos-u85" else "corstone-300"
    if board != want:
        raise TargetError(f"{npu} is on {want}, not {board}: use fvp://{want}/{proc}")
    return Variant(key, board, npu, macs, fvp)


def find_fvp(variant: Variant, config: dict[str, Any]) -> tuple[Path | None, list[str]]:
    """Locate the FVP binary: config `fvp_path` (binary or directory), then PATH.
    Returns (path or None, the locations searched)."""
    searched: list[str] = []
    configured = config.get("fvp_path")
    if configured:
        p = Path(str(configured)).expanduser()
        candidates = [p / variant.fvp, p] if p.is_dir() else [p]
        for c in candidates:
            searched.append(str(c))
            if c.is_file() and os.access(c, os.X_OK) and (c.name == variant.fvp or c == p):
                return c, searched
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        searched.append(str(Path(d) / variant.fvp))
    found = shutil.which(variant.fvp)
    return (Path(found) if found else None), searched


def fvp_version(fvp: Path, timeout_s: float = 30.0) -> str | None:
    """First line of `<FVP> --version` (how ExecuTorch checks an install), or None."""
    try:
        proc = subprocess.run(
            [str(fvp), "--version"], capture_output=True, text=True, errors="replace",
            timeout=timeout_s, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return lines[0] if proc.returncode == 0 and lines else None


def _lookup(config: dict[str, Any], variant: Variant, name: str) -> Any:
    """A setting from the per-target table (`[targets.fvp."corstone-300/ethos-u55-128"]`
    or `[targets.fvp.ethos-u55-128]`), a `<name>s` map keyed the same way, or the
    section itself."""
    for key in (variant.key, variant.build_target, variant.processor):
        sub = config.get(key)
        if isinstance(sub, dict) and sub.get(name) is not None:
            return sub[name]
        table = config.get(name + "s")
        if isinstance(table, dict) and table.get(key) is not None:
            return table[key]
    value = config.get(name)
    if isinstance(value, dict):
        return None
    return value


def find_runner_elf(variant: Variant, config: dict[str, Any], uart: bool) -> tuple[Path | None, list[str]]:
    """The arm_executor_runner ELF for this target: config, then ExecuTorch's
    default build locations under $EXECUTORCH_ROOT (arm_test/...)."""
    searched: list[str] = []
    names = ("uart_runner_elf", "runner_elf") if uart else ("runner_elf",)
    for name in names:
        value = _lookup(config, variant, name)
        if value:
            p = Path(str(value)).expanduser()
            searched.append(str(p))
            if p.is_file():
                return p, searched
            return None, searched  # an explicit setting that is wrong: do not guess further
    root = os.environ.get("EXECUTORCH_ROOT")
    if root and not uart:
        legacy = {"corstone-300": "corstone-300", "corstone-320": "corstone-320"}[variant.board]
        if variant.processor == "ethos-u65":
            legacy = "corstone-300-u65"
        for build_dir in (
            f"arm_test/arm_semihosting_executor_runner_{variant.build_target}",
            f"arm_test/arm_semihosting_executor_runner_{legacy}",
        ):
            for sub in ("", "Release/"):
                c = Path(root) / build_dir / sub / "arm_executor_runner"
                searched.append(str(c))
                if c.is_file():
                    return c, searched
    return None, searched


def fvp_command(
    variant: Variant,
    fvp: Path,
    elf: Path,
    timelimit: int,
    *,
    semihosting_cwd: Path | None = None,
    cmd_line: str | None = None,
    fast: bool = False,
    data: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The FVP command line, option for option as ExecuTorch's run_fvp.sh/runner_utils."""
    c: list[str] = [str(fvp)]

    def opt(value: str) -> None:
        c.extend(["-C", value])

    if variant.board == "corstone-300":
        opt(f"ethosu.num_macs={variant.num_macs}")
        opt("mps3_board.visualisation.disable-visualisation=1")
        opt("mps3_board.telnetterminal0.start_telnet=0")
        opt("mps3_board.uart0.out_file=-")
        opt("mps3_board.uart0.shutdown_on_eot=1")
        cpu = "cpu0"
        if fast:
            opt("ethosu.extra_args=--fast")
    else:
        opt(f"mps4_board.subsystem.ethosu.num_macs={variant.num_macs}")
        opt("mps4_board.visualisation.disable-visualisation=1")
        opt("vis_hdlcd.disable_visualisation=1")
        opt("mps4_board.telnetterminal0.start_telnet=0")
        opt("mps4_board.uart0.out_file=-")
        opt("mps4_board.uart0.unbuffered_output=1")
        opt("mps4_board.uart0.shutdown_on_eot=1")
        cpu = "mps4_board.subsystem.cpu0"
        if fast:
            opt("mps4_board.subsystem.ethosu.extra_args=--fast")
    if semihosting_cwd is not None:
        opt(f"{cpu}.semihosting-enable=1")
        opt(f"{cpu}.semihosting-stack_base=0")
        opt(f"{cpu}.semihosting-heap_limit=0")
        opt(f"{cpu}.semihosting-cwd={semihosting_cwd}")
        opt(f"{cpu}.semihosting-cmd_line={cmd_line}")
    for value in extra or []:
        opt(value)
    c.extend(["-a", str(elf)])
    if data:
        c.extend(["--data", data])
    c.extend(["--timelimit", str(int(timelimit))])
    return c


@dataclass
class ProcessOutcome:
    log: RunnerLog
    returncode: int | None
    host_timeout: bool
    elapsed_s: float
    log_path: Path
    killed_early: bool = False  # finished or crashed per the log, and the FVP did not exit by itself


def run_fvp_process(
    cmd: list[str],
    cwd: Path,
    log_path: Path,
    wall_timeout_s: float,
    exit_grace_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> ProcessOutcome:
    """Run the FVP in its own process group; stream stdout+stderr into the log file
    and the parser; kill the whole group on the wall-clock bound, when the log says
    the session is over but the FVP lingers, or when the runner crashed and went quiet."""
    parser = IncrementalLogParser()
    start = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as sink:
        sink.write(("$ " + " ".join(cmd) + "\n").encode())
        sink.flush()
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            raise TargetError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from None
        finished_at: list[float] = []
        last_data = [start]

        def pump() -> None:
            fd = proc.stdout.fileno()
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                last_data[0] = time.monotonic()
                sink.write(chunk)
                sink.flush()
                parser.feed(chunk)
                if parser.finished and not finished_at:
                    finished_at.append(time.monotonic())

        reader = threading.Thread(target=pump, name="fvp-log", daemon=True)
        reader.start()
        host_timeout = killed_early = False
        deadline = start + wall_timeout_s
        while True:
            try:
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now >= deadline:
                    host_timeout = True
                    kill_process_group(proc)
                    break
                if finished_at and now - finished_at[0] > exit_grace_s:
                    killed_early = True
                    kill_process_group(proc)
                    break
                # A crashed runner (fault handler loop, or et_pal_abort's trap on a
                # UART build) never ends the simulation: stop once it has gone quiet.
                if parser.crashed and now - last_data[0] > exit_grace_s:
                    killed_early = True
                    kill_process_group(proc)
                    break
        _reap_group(proc)
        reader.join(timeout=5)
        proc.stdout.close()
    return ProcessOutcome(
        log=parser.result(),
        returncode=proc.returncode,
        host_timeout=host_timeout,
        elapsed_s=time.monotonic() - start,
        log_path=log_path,
        killed_early=killed_early,
    )


def _reap_group(proc: subprocess.Popen) -> None:
    """The FVP exited (or was killed): make sure nothing it started survives."""
    if proc.returncode is None:
        kill_process_group(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Classification:
    status: CaseStatus
    error: str | None = None
    kind: str | None = None
    excerpt: list[str] = field(default_factory=list)


def classify_log(outcome: ProcessOutcome, timelimit: int, wall_timeout_s: float) -> Classification | None:
    """The failure a session's log shows, or None when the runner ran to the
    point where outputs can be collected (a BundleIO FAIL verdict included)."""
    log = outcome.log
    excerpt = log.excerpt()
    if outcome.host_timeout:
        tail = [ln.raw for ln in log.lines[-10:]]
        return Classification(
            CaseStatus.TIMEOUT,
            f"FVP still running after {wall_timeout_s:.0f}s wall clock (--timelimit {timelimit}); process group killed",
            "host-timeout",
            excerpt or tail,
        )
    hard = [f for f in log.fatal if FAULT_RE.search(f)]
    if hard:
        return Classification(CaseStatus.ERROR, f"target crashed: {hard[0].strip()}", "hard-fault", excerpt)
    if log.boots > 1:
        return Classification(CaseStatus.ERROR, f"target rebooted during the run ({log.boots} starts)", "reboot", excerpt)
    unexpected = [
        e.raw for e in log.errors if not any(marker in e.message for marker in _VERIFY_FAIL_MARKERS)
    ]
    asserts = [
        f
        for f in log.fatal
        if "CPU time has been exceeded" not in f and not any(m in f for m in _VERIFY_FAIL_MARKERS)
    ]
    if unexpected or asserts:
        first = (unexpected or asserts)[0].strip()
        kind = "runner-fatal" if first.startswith("F") or asserts else "runner-error"
        return Classification(CaseStatus.ERROR, f"runner error: {first}", kind, excerpt)
    if log.cpu_time_exceeded and not log.program_complete and log.bundle_verdict is None:
        return Classification(
            CaseStatus.TIMEOUT,
            f"FVP --timelimit {timelimit}s reached: CPU time has been exceeded",
            "cpu-time-exceeded",
            excerpt or [ln.raw for ln in log.lines[-10:]],
        )
    if not any(ln.level for ln in log.lines):
        tail = [ln.raw for ln in log.lines[-15:]]
        if outcome.returncode not in (0, None):
            said = next((ln.raw.strip() for ln in log.lines if ln.raw.strip().lower().startswith(("error", "fatal"))), None)
            said = said or next((t.strip() for t in reversed(tail) if t.strip()), "no output")
            return Classification(
                CaseStatus.ERROR, f"FVP failed (exit {outcome.returncode}) before the runner started: {said}", "fvp-failed", tail
            )
        return Classification(
            CaseStatus.ERROR,
            f"no arm_executor_runner log lines in FVP output ({len(log.lines)} other lines; exit code {outcome.returncode})",
            "no-runner-output",
            tail,
        )
    if not log.program_complete and log.bundle_verdict != "FAIL" and not log.eot_seen:
        return Classification(
            CaseStatus.ERROR,
            "runner stopped before 'Program complete, exiting.'"
            + (f" (FVP: {log.simulation_stopped})" if log.simulation_stopped else ""),
            "incomplete",
            excerpt or [ln.raw for ln in log.lines[-10:]],
        )
    return None


def device_verdict(log: RunnerLog) -> dict[str, Any] | None:
    """The runner's own BundleIO verdict (test case 0 of what it ran)."""
    if log.bundle_verdict is None and not log.error_stats:
        return None
    out: dict[str, Any] = {"source": "arm_executor_runner BundleIO", "verdict": log.bundle_verdict}
    if log.verdict_tolerances:
        out["tolerances"] = dict(log.verdict_tolerances)
    if log.verification_status is not None:
        out["status"] = log.verification_status
    if log.error_stats:
        out["error_stats"] = dict(log.error_stats)
    return out


def output_files(case_dir: Path) -> list[Path]:
    """`out-<i>.bin` sorted numerically (out-10 after out-9)."""
    found = []
    for p in case_dir.iterdir():
        m = _OUT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


STOCK_ET_TOL = 0.01  # arm_executor_runner's ET_ATOL/ET_RTOL default


def firmware_tolerance(manifest: dict[str, Any] | None, method: str | None = None) -> tuple[float, float, list[str]]:
    """The loosest (atol, rtol) over a bundle's floating outputs, for compiling
    ET_ATOL/ET_RTOL into a UART runner. atol includes qtol*scale.

    The firmware check differs from bundlerun's (rtol scales the *actual* value;
    non-float outputs must be byte-identical whatever ET_ATOL says), so notes
    say what the firmware cannot express. Without a manifest the stock 0.01
    defaults are returned with a note."""
    from bundles.manifest import Manifest

    notes: list[str] = []
    if not manifest:
        return STOCK_ET_TOL, STOCK_ET_TOL, ["bundle has no bundlerun manifest; using the runner's default 0.01/0.01"]
    try:
        parsed = Manifest.from_dict(manifest)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"bundle manifest is unreadable: {exc}") from None
    atols: list[float] = []
    rtols: list[float] = []
    for name, meth in parsed.methods.items():
        if method and name != method:
            continue
        for out in meth.outputs:
            c = out.criteria
            if out.dtype not in ("float32", "float64", "float16"):
                notes.append(f"{name}.{out.name} is {out.dtype}: the firmware compares it byte for byte")
                continue
            if not c.elementwise:
                notes.append(f"{name}.{out.name} has no element-wise criterion; firmware verdict uses the others' loosest")
                continue
            atols.append(c.effective_atol)
            rtols.append(c.rtol or 0.0)
    if not atols:
        notes.append("no element-wise float criteria; using the runner's default 0.01/0.01")
        return STOCK_ET_TOL, STOCK_ET_TOL, notes
    return max(atols), max(rtols), notes


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _number(cfg: dict[str, Any], variant: Variant, name: str, default: float) -> float:
    value = _lookup(cfg, variant, name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"[targets.fvp] {name} must be a number of seconds, not {value!r}") from None
    if number <= 0:
        raise ConfigError(f"[targets.fvp] {name} must be positive, not {value!r}")
    return number


@dataclass
class _Plan:
    """Everything one run's FVP sessions share."""

    fvp: Path
    elf: Path
    work: Path
    logs: Path
    timelimit: int
    grace_s: float
    exit_grace_s: float
    fast: bool
    extra: list[str]
    model_addr: str | None


class FVPTarget:
    """Runs bundles on a Corstone FVP; see the module docstring."""

    def __init__(self, url: str, variant: Variant, config: dict[str, Any]):
        self.url = url
        self.variant = variant
        self.config = config

    def _settings(self, options: RunOptions) -> dict[str, Any]:
        cfg = dict(self.config)
        cfg.update({k: v for k, v in options.config.items() if v is not None})
        return cfg

    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        cfg = self._settings(options)
        v = self.variant
        mode = str(_lookup(cfg, v, "mode") or "semihosting").lower()
        if mode not in ("semihosting", "uart"):
            raise ConfigError(f"[targets.fvp] mode must be 'semihosting' or 'uart', not {mode!r}")
        fvp, searched = find_fvp(v, cfg)
        if fvp is None:
            raise TargetError(
                f"{v.fvp} not found (searched: {', '.join(searched) or 'PATH is empty'}); "
                "install the Corstone FVP (examples/arm/setup.sh) or set [targets.fvp] fvp_path"
            )
        elf, elf_searched = find_runner_elf(v, cfg, uart=mode == "uart")
        if elf is None:
            what = "UART" if mode == "uart" else "semihosting BundleIO"
            key = "uart_runner_elf" if mode == "uart" else "runner_elf"
            raise TargetError(
                f"no {what} arm_executor_runner ELF for {v.key} "
                f"(searched: {', '.join(elf_searched) or 'nothing configured'}); build one with "
                f"firmware_scripts/arm/build_runner.sh --target={v.build_target} and set "
                f"[targets.fvp] {key} or pass --target-opt {key}=PATH"
            )
        extra = _lookup(cfg, v, "extra_args") or []
        if isinstance(extra, str):  # --target-opt extra_args="ethosu.foo=1 cpu0.bar=2"
            import shlex

            extra = shlex.split(extra)
        plan = _Plan(
            fvp=fvp,
            elf=elf,
            work=Path(options.work_dir) / "fvp",
            logs=Path(options.work_dir) / "logs",
            timelimit=max(1, int(_number(cfg, v, "timelimit", options.case_timeout_s))),
            grace_s=_number(cfg, v, "host_timeout_grace_s", 30.0),
            exit_grace_s=_number(cfg, v, "exit_grace_s", 5.0),
            fast=_bool(_lookup(cfg, v, "fast") or False),
            extra=[str(x) for x in extra],
            model_addr=_lookup(cfg, v, "model_addr") or None,
        )
        plan.work.mkdir(parents=True, exist_ok=True)
        info = {
            "fvp": str(fvp),
            "runner_elf": str(elf),
            "variant": v.key,
            "mode": mode,
            "timelimit_s": plan.timelimit,
            "fast": plan.fast,
            "fvp_version": fvp_version(fvp),
        }
        run = TargetRun(target=self.url, cases=[], info=info)
        for method, index in selected_cases(bundle, options):
            if mode == "semihosting":
                result = self._semihosting_case(bundle, method, index, plan)
            else:
                result = self._uart_case(bundle, method, index, plan, first=not run.cases)
            if result.log_path:
                run.logs[f"{method}[{index}]"] = result.log_path
            run.cases.append(result)
            if options.progress:
                options.progress(result)
        return run

    # -- semihosting: one FVP session per test case ---------------------------------

    def _semihosting_case(self, bundle: Bundle, method: str, index: int, plan: _Plan) -> CaseResult:
        cmd_line = f"executor_runner -m {BUNDLE_NAME} -i {DUMMY_INPUT} -o {OUTPUT_BASENAME}"
        assert len(cmd_line) < SEMIHOSTING_CMDLINE_MAX  # relative names keep it short by construction
        case_dir = plan.work / f"{_safe(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        for stale in output_files(case_dir):  # the runner never removes old outputs
            stale.unlink()
        (case_dir / BUNDLE_NAME).write_bytes(serialize_bundle(bundle.single_case(method, index)))
        (case_dir / DUMMY_INPUT).write_bytes(b"\0\0\0\0")
        cmd = fvp_command(
            self.variant, plan.fvp, plan.elf, plan.timelimit,
            semihosting_cwd=case_dir.resolve(), cmd_line=cmd_line, fast=plan.fast, extra=plan.extra,
        )
        result, log = self._session(cmd, case_dir, plan.logs / f"fvp-{_safe(method)}-{index}.log", plan, method, index)
        if result.status is CaseStatus.OK:
            outs, err = raw_outputs_from_files(output_files(case_dir), expected_layout(bundle, method, index))
            if err:
                kind = "wrong-size-output" if "bytes, expected" in err else "missing-output"
                result.status, result.error, result.error_kind = CaseStatus.ERROR, err, kind
                about_outputs = [ln.raw for ln in log.lines if ln.level and "output" in ln.message.lower()]
                result.log_excerpt = (about_outputs or [ln.raw for ln in log.lines[-10:]])[-15:]
            else:
                result.outputs = outs
        return result

    # -- UART: bundle in the ELF or placed with --data ------------------------------

    def _uart_case(self, bundle: Bundle, method: str, index: int, plan: _Plan, first: bool) -> CaseResult:
        linked = plan.model_addr is None
        if linked and (not first or index != 0 or method != bundle.method_test_suites[0].method_name):
            return CaseResult(
                method, index, CaseStatus.SKIP,
                error="the UART runner has the bundle linked in and runs its case 0 only; "
                "set [targets.fvp] model_addr (--data) or use semihosting mode for every case",
                error_kind="unsupported",
            )
        case_dir = plan.work / f"uart-{_safe(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        data = None
        if not linked:
            placed = case_dir / BUNDLE_NAME
            placed.write_bytes(serialize_bundle(bundle.single_case(method, index)))
            data = f"{placed.resolve()}@{plan.model_addr}"
        cmd = fvp_command(self.variant, plan.fvp, plan.elf, plan.timelimit, fast=plan.fast, data=data, extra=plan.extra)
        result, log = self._session(cmd, case_dir, plan.logs / f"fvp-uart-{_safe(method)}-{index}.log", plan, method, index)
        if result.status is CaseStatus.OK:
            outs, err = self._uart_outputs(log, expected_layout(bundle, method, index))
            if err:
                result.status, result.error, result.error_kind = CaseStatus.ERROR, err, "missing-output"
            else:
                result.outputs = outs
        return result

    @staticmethod
    def _uart_outputs(log: RunnerLog, layout) -> tuple[list[RawTensor], str | None]:
        """ETDump block (bit exact) when present, else the printed lines (lossy)."""
        from targets.etdump_outputs import OutputDecodeError, outputs_from_etdump_b64, outputs_from_printed

        try:
            if log.etdump_b64:
                return list(outputs_from_etdump_b64(log.etdump_b64, layout, log.debug_buffer_b64)), None
            if log.printed_outputs:
                return list(outputs_from_printed(log.printed_outputs, layout)), None
        except OutputDecodeError as exc:
            return [], str(exc)
        return [], "runner printed neither an ETDump block nor Output[i][j] lines (build with ET_LOG_DUMP_OUTPUT or ETDump)"

    # -- shared ----------------------------------------------------------------------

    def _session(self, cmd, cwd, log_path, plan: _Plan, method, index) -> tuple[CaseResult, RunnerLog]:
        wall = plan.timelimit + plan.grace_s
        outcome = run_fvp_process(cmd, cwd, log_path, wall, exit_grace_s=plan.exit_grace_s)
        bad = classify_log(outcome, plan.timelimit, wall)
        result = CaseResult(
            method,
            index,
            CaseStatus.OK,
            log_path=str(log_path),
            elapsed_s=outcome.elapsed_s,
            device_verdict=device_verdict(outcome.log),
            extra={"fvp_returncode": outcome.returncode},
        )
        if outcome.log.partial_last_line:
            result.extra["partial_last_line"] = outcome.log.partial_last_line
        if outcome.killed_early:
            result.extra["fvp_killed_after_finish"] = True
        if bad is not None:
            result.status, result.error, result.error_kind, result.log_excerpt = bad.status, bad.error, bad.kind, bad.excerpt
        else:
            result.log_excerpt = outcome.log.excerpt(limit=20)
        return result, outcome.log


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def create(url, config: dict) -> FVPTarget:
    """Entry point for targets.open_target: `fvp://<platform>/<processor>`."""
    variant = parse_variant(url.netloc, url.path)
    cfg = dict(config or {})
    for key, value in url.query.items():  # ?mode=uart&fast=1&timelimit=60
        cfg[key] = value
    return FVPTarget(url.raw, variant, cfg)
