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
(targets.et_runner.log). The FVP runs in its own process group under a host
wall-clock bound on top of its own `--timelimit`; the whole group is killed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundlerun.bundles.arm_platforms import FVP_300_U55, FVP_300_U65, FVP_320, FVP_BINARIES, Platform, parse_platform
from bundlerun.bundles.errors import ConfigError, TargetError
from bundlerun.targets.et_runner.protocol import case_from_session, clear_outputs
from bundlerun.targets.arm.simulator import run_session_process, session_end
from bundlerun.targets import Check, TargetSpec, TargetURL, lazy
from bundlerun.targets.base import (CaseResult, CaseStatus, RunOptions, TargetBase, TargetRun, expected_layout,
                                    safe_name as _safe, selected_cases)
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.settings import check_keys

if TYPE_CHECKING:  # the bundle reader (and numpy) load only when a run starts
    from bundlerun.bundles.bpte import Bundle
    from bundlerun.bundles.manifest import Manifest

__all__ = ["FVP_300_U55", "FVP_300_U65", "FVP_320", "FVP_BINARIES", "fvp_command", "parse_variant", "find_fvp",
           "fvp_version", "find_runner_elf", "firmware_tolerance", "create"]

SEMIHOSTING_CMDLINE_MAX = 256  # the FVP truncates the semihosting command line past this
DUMMY_INPUT = "dummy.bin"  # '-i' is mandatory even for a bundle; 4 bytes are enough
BUNDLE_NAME = "model.bpte"
OUTPUT_BASENAME = "out"
SEMIHOSTING_CMD_LINE = f"executor_runner -m {BUNDLE_NAME} -i {DUMMY_INPUT} -o {OUTPUT_BASENAME}"

Variant = Platform  # one FVP platform + processor configuration (bundles.arm_platforms)


def parse_variant(netloc: str, path: str) -> Platform:
    """`corstone-300` + `/ethos-u55-128` -> Platform; a one-line TargetError otherwise."""
    try:
        return parse_platform(netloc, path)
    except ValueError as exc:
        raise TargetError(f"fvp://{netloc}{path}: {exc}") from None


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
    from bundlerun.targets import argv  # paths absolute, no control characters (targets/argv.py)

    c: list[str] = [argv.program(str(fvp), "FVP")]

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
    c.extend(["-a", argv.option_value(elf, "runner ELF")])
    if data:
        c.extend(["--data", data])
    c.extend(["--timelimit", str(int(timelimit))])
    return c


STOCK_ET_TOL = 0.01  # arm_executor_runner's ET_ATOL/ET_RTOL default


def firmware_tolerance(manifest: "Manifest | None", method: str | None = None) -> tuple[float, float, list[str]]:
    """The loosest (atol, rtol) over a bundle's floating outputs, for compiling
    ET_ATOL/ET_RTOL into a UART runner. atol includes qtol*scale.

    The firmware check differs from bundlerun's (rtol scales the *actual* value;
    non-float outputs must be byte-identical whatever ET_ATOL says), so notes
    say what the firmware cannot express. Without a manifest the stock 0.01
    defaults are returned with a note."""
    notes: list[str] = []
    if manifest is None:
        return STOCK_ET_TOL, STOCK_ET_TOL, ["bundle has no bundlerun manifest; using the runner's default 0.01/0.01"]
    parsed = manifest  # parsed and validated when the bundle was read (bundles/bpte.py)
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


class FVPTarget(TargetBase):
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
            run.record(result, options)
        return run

    # -- semihosting: one FVP session per test case ---------------------------------

    def _semihosting_case(self, bundle: Bundle, method: str, index: int, plan: _Plan) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        assert len(SEMIHOSTING_CMD_LINE) < SEMIHOSTING_CMDLINE_MAX  # relative names keep it short by construction
        case_dir = plan.work / f"{_safe(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        clear_outputs(case_dir, OUTPUT_BASENAME)
        (case_dir / BUNDLE_NAME).write_bytes(serialize_bundle(bundle.single_case(method, index)))
        (case_dir / DUMMY_INPUT).write_bytes(b"\0\0\0\0")
        cmd = fvp_command(
            self.variant, plan.fvp, plan.elf, plan.timelimit,
            semihosting_cwd=case_dir.resolve(), cmd_line=SEMIHOSTING_CMD_LINE, fast=plan.fast, extra=plan.extra,
        )
        log_path = plan.logs / f"fvp-{_safe(method)}-{index}.log"
        return self._session(cmd, case_dir, log_path, plan, method, index, bundle, files_dir=case_dir, prefer="files")

    # -- UART: bundle in the ELF or placed with --data ------------------------------

    def _uart_case(self, bundle: Bundle, method: str, index: int, plan: _Plan, first: bool) -> CaseResult:
        from bundlerun.bundles.bpte import serialize_bundle  # start-up: not loaded by `bundlerun --help`

        linked = plan.model_addr is None
        if linked and (not first or index != 0 or method != bundle.method_test_suites[0].method_name):
            return CaseResult(
                method, index, CaseStatus.SKIP,
                error="the UART runner has the bundle linked in and runs its case 0 only; "
                "set [targets.fvp] model_addr (--data) or use semihosting mode for every case",
                error_kind=FailureKind.UNSUPPORTED,
            )
        case_dir = plan.work / f"uart-{_safe(method)}-{index}"
        case_dir.mkdir(parents=True, exist_ok=True)
        data = None
        if not linked:
            placed = case_dir / BUNDLE_NAME
            placed.write_bytes(serialize_bundle(bundle.single_case(method, index)))
            data = f"{placed.resolve()}@{plan.model_addr}"
        cmd = fvp_command(self.variant, plan.fvp, plan.elf, plan.timelimit, fast=plan.fast, data=data, extra=plan.extra)
        log_path = plan.logs / f"fvp-uart-{_safe(method)}-{index}.log"
        return self._session(cmd, case_dir, log_path, plan, method, index, bundle, files_dir=None)

    # -- shared ----------------------------------------------------------------------

    def _session(self, cmd, cwd, log_path, plan: _Plan, method: str, index: int, bundle: Bundle,
                 files_dir: Path | None, prefer: str = "auto") -> CaseResult:
        wall = plan.timelimit + plan.grace_s
        outcome = run_session_process(cmd, cwd, log_path, wall, exit_grace_s=plan.exit_grace_s)
        return case_from_session(
            outcome.log, session_end(outcome, "FVP", wall), method, index, expected_layout(bundle, method, index),
            files_dir, log_path, outcome.elapsed_s,
            extra={"fvp_returncode": outcome.returncode, **({"fvp_killed_after_finish": True} if outcome.killed_early else {})},
            prefer=prefer,
        )


# Settings of [targets.fvp]; each may also sit in a per-platform table
# ([targets.fvp."corstone-300/ethos-u55-128"], [targets.fvp.ethos-u55-128]) or a `<name>s` map.
SETTINGS = ("mode", "fvp_path", "runner_elf", "uart_runner_elf", "timelimit", "host_timeout_grace_s",
            "exit_grace_s", "fast", "extra_args", "model_addr",
            "debug_elf")  # debug_elf: `bundlerun debug`'s runner built with ETDump (targets/arm/intermediates.py)


def check_settings(cfg: dict[str, Any]) -> None:
    """Unknown keys are errors (with a did-you-mean), at the top and in per-platform tables."""

    for key, value in cfg.items():
        if isinstance(value, dict) and key not in SETTINGS:
            if key.endswith("s") and key[:-1] in SETTINGS:
                continue  # e.g. runner_elfs = {"ethos-u55-128" = "..."}
            check_keys(f"targets.fvp.{key}", value, SETTINGS)
        else:
            check_keys("targets.fvp", [key], SETTINGS)


def _doctor(section: dict) -> list[Check]:
    from bundlerun.targets.probes import dist_check, tool_check  # start-up: not loaded by `bundlerun --help`

    rows = []
    for name in FVP_BINARIES:
        path = None
        if section.get("fvp_path"):
            p = Path(str(section["fvp_path"])).expanduser()
            cand = p / name if p.is_dir() else p
            path = str(cand) if cand.is_file() else None
        rows.append(tool_check(name, ["--version"], "install the Corstone FVP", path))
    rows.append(tool_check("arm-none-eabi-gcc", ["--version"], "needed only to build runners"))
    elfs = configured_elfs(section)
    if not elfs:
        rows.append(Check("FVP runner ELF", None, "none configured ([targets.fvp] runner_elf)"))
    for label, value in elfs:
        p = Path(str(value)).expanduser()
        rows.append(Check(f"runner ELF {label}", p.is_file(), elf_kind(p) if p.is_file() else "missing", str(p)))
    rows.append(dist_check("Vela", "ethos-u-vela", "ethosu.vela", "pip install 'bundlerun[arm]'"))
    return rows


def configured_elfs(section: dict) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key in ("runner_elf", "uart_runner_elf"):
        if isinstance(section.get(key), str) and section[key]:
            out.append((key, section[key]))
    for key in ("runner_elfs", "uart_runner_elfs"):
        if isinstance(section.get(key), dict):
            out.extend((f"{key}[{k}]", v) for k, v in section[key].items() if isinstance(v, str))
    for key, sub in section.items():
        if isinstance(sub, dict) and key not in ("runner_elfs", "uart_runner_elfs"):
            out.extend((f"{key} {n}", sub[n]) for n in ("runner_elf", "uart_runner_elf") if isinstance(sub.get(n), str))
    return out


def elf_kind(path: Path) -> str:
    """What an ELF file is built for, from its header (no toolchain needed)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if head[:4] != b"\x7fELF":
        return "not an ELF file"
    machine = int.from_bytes(head[18:20], "little")
    return {40: "ELF, Arm", 183: "ELF, AArch64", 62: "ELF, x86-64"}.get(machine, f"ELF, machine {machine}")


def _default_backend(url: TargetURL) -> str:
    return "cortex-m" if "cortex-m" in url.rest.lower() else "arm"


SPEC = TargetSpec(
    name="fvp",
    schemes=("fvp",),
    summary="a Corstone FVP running ExecuTorch's arm_executor_runner (Ethos-U55/U65/U85, Cortex-M)",
    examples=("fvp://corstone-300/ethos-u55-128", "fvp://corstone-320/ethos-u85-256", "fvp://corstone-300/cortex-m55"),
    default_backend=_default_backend,
    doctor=_doctor,
    # the FVP binary, its extra options, and firmware it runs with semihosting (files on this machine);
    # also refused inside per-platform tables and their `<name>s` maps
    command_settings=("fvp_path", "extra_args", "runner_elf", "uart_runner_elf", "debug_elf"),
    capture=lazy("bundlerun.targets.arm.intermediates:capture"),
    lowering=lambda url: platform_lowering(url.raw, *_board_core(url)),
)


def _board_core(url: TargetURL) -> tuple[str, str]:
    parts = url.rest.lower().split("/")
    if len(parts) != 2:
        raise TargetError(f"FVP target {url.raw!r} must look like fvp://corstone-300/ethos-u55-128", kind=FailureKind.BAD_CONFIG)
    return parts[0], parts[1]


def platform_lowering(url: str, board: str, core: str) -> dict[str, Any]:
    """What a Corstone platform means for the Arm recipe (bundles/backends/arm.py): an Ethos-U
    accelerator (Vela) or a Cortex-M core (CMSIS-NN kernels), both integer."""
    try:
        platform = parse_platform(board, core)
    except ValueError as exc:
        raise TargetError(f"{exc} ({url})", kind=FailureKind.BAD_CONFIG) from None
    if platform.has_npu:
        return {"arm": "ethos-u", "integer": True, "accelerator": platform.accelerator}
    return {"arm": "cortex-m", "integer": True, "cpu": platform.cpu}


def create(url, config: dict) -> FVPTarget:
    """Entry point for targets.open_target: `fvp://<platform>/<processor>`."""
    variant = parse_variant(url.netloc, url.path)
    cfg = dict(config or {})
    for key, value in url.query.items():  # ?mode=uart&fast=1&timelimit=60
        cfg[key] = value
    check_settings(cfg)
    return FVPTarget(url.raw, variant, cfg)
