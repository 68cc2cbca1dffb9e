"""Parse the log of ExecuTorch's Arm `arm_executor_runner` (FVP stdout or a board's UART).

The runner logs with `"%c [executorch:%s:%lu %s()] %s"` (level letter D/I/E/F),
prints BundleIO markers, error stats, `Output[i][j]` lines and an ETDump base64
block, and ends a UART-only run with an EOT byte (0x04). Older runners used
`I [executorch:file.cpp:123] msg` and `I executorch:file.cpp:123] msg`; both are
understood too. Everything else on the stream (FVP banners, `Info:`/`WARNING:`
lines, telnet notices) is kept as a non-runner line.

The FVP's exit code is unreliable, so targets judge a run by what this parser
finds. `IncrementalLogParser` serves a live UART stream: lines split across
chunks, CR/CRLF mixes, EOT and non-UTF-8 garbage are all handled.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from bundlerun.targets.base import Verdict

EOT = 0x04
_EOL_RE = re.compile(rb"\r\n|\r|\n")
# A printed element index may skip a few lost lines, never millions (then it is UART noise).
MAX_PRINTED_GAP = 1 << 16
MAX_PRINTED_OUTPUTS = 1 << 12

# Current:   I [executorch:arm_executor_runner.cpp:612 main()] msg
# Older:     I [executorch:arm_executor_runner.cpp:675] msg
# Oldest:    I executorch:arm_executor_runner.cpp:60] msg
# Timestamp: I 00:00:00.364824 executorch:executor_runner.cpp:76] msg   (posix PAL: seconds since boot)
_RUNNER_RE = re.compile(
    r"(?P<level>[DIEF?]) (?:(?P<ts>\d+:\d\d:\d\d\.\d+) )?\[?executorch:(?P<file>[^:\]\s]+):(?P<line>\d+)"
    r"(?: (?P<func>[^\]\s]*?)(?:\(\))?)?\] ?(?P<msg>.*)$"
)
_OUTPUT_RE = re.compile(
    r"^Output\[(?P<i>\d+)\]\[(?P<j>\d+)\]:\s*(?:\((?P<kind>\w+)\)\s*)?(?P<value>\S+)"
)
# The portable executor_runner's --print_output summary: `OutputX 0: tensor(sizes=[1, 4], [0.1, 0.2, ...])`
# (older releases: `Output 0: ...`); long lists wrap over several lines and may elide with `...`.
_TENSOR_START_RE = re.compile(r"^OutputX? (?P<i>\d+): tensor\(sizes=\[(?P<sizes>[\d, ]*)\], \[(?P<rest>.*)$")
# Lines that look like errors but are not a cause: the runner says it ignores them.
BENIGN_RE = re.compile(r"ignoring error from set_output_data_ptr\(\)|Skipping non-tensor input")
# How a run says it ended well: current runners, Zephyr builds, older runners (+ EXITTHESIM).
_SUCCESS_MARKERS = ("Program complete, exiting.", "Application exit code: 0.")
_TOL_RE = re.compile(r"rtol=(?P<rtol>[-+0-9.eEnaif]+)\s+atol=(?P<atol>[-+0-9.eEnaif]+)")
_STATUS_RE = re.compile(r"Bundle verification failed with status (?P<status>0x[0-9a-fA-F]+|\d+)")
_STAT_RE = re.compile(
    r"^\s*(?P<name>mean_absolute_error|max_absolute_error|mean_relative_error|max_relative_error)"
    r"\s*:\s*(?P<value>\S+)"
)
_RESULT_RE = re.compile(r"Test_result:\s*(?P<verdict>PASS|FAIL)")
ECHO_RE = re.compile(r'echo\s+"(?P<b64>[^"]*)"\s*\|\s*base64\s+-d\s*>\s*(?P<name>\S+)')
# CPU faults: "Hard fault" (ExecuTorch's own log check) and the Arm platform's
# fault handlers ("Exception caught by function BusFault_Handler").
FAULT_RE = re.compile(r"hard ?fault|Exception caught by function \w+_Handler|\b(Bus|Usage|MemManage|Secure)Fault\b", re.IGNORECASE)
_FATAL_RES = (
    FAULT_RE,
    re.compile(r"assert(?:ion)?\b.*\bfailed|assert failed|^Assertion", re.IGNORECASE),
    re.compile(r"CPU time has been exceeded"),
    re.compile(r"^\[critical\]"),
)
_FATAL_ANY = re.compile(
    "|".join(f"(?i:{r.pattern})" if r.flags & re.IGNORECASE else f"(?:{r.pattern})" for r in _FATAL_RES[1:])
)
# ETDumpGen's debug buffer ran full (data_sinks/buffer_data_sink.cpp logs the E line, then
# etdump_flatcc.cpp's log_evalue aborts with the F line): the intermediates do not fit.
DEBUG_BUFFER_FULL_RE = re.compile(r"failed to write tensor to debug buffer|Ran out of space to store intermediate outputs")
# arm_executor_runner.cpp runner_init(): how large the debug buffer it set up is
DEBUG_BUFFER_SIZE_RE = re.compile(r"ETDump: Allocated (?:intermediate )?output buffer size: (?P<size>\d+)")
_BOOT_RUNNER = "Running executor with parameter:"
_MODEL_START_RE = re.compile(r"^(PTE @ |PTE in 0x|Model in (0x)?[0-9A-Fa-f]+)")
_BANNER_RE = re.compile(r"Ethos-U rev [0-9a-fA-F]+ ---")


@dataclass
class LogLine:
    """One line of the stream; `level` is None for lines not produced by ET_LOG."""

    raw: str
    level: str | None
    file: str | None
    line: int | None
    func: str | None
    message: str


@dataclass
class RunnerLog:
    """Everything bundlerun needs from one runner session's log."""

    lines: list[LogLine] = field(default_factory=list)
    errors: list[LogLine] = field(default_factory=list)  # E/F lines
    fatal: list[str] = field(default_factory=list)  # hard fault, assertion, CPU time exceeded
    bundle_verdict: Verdict | None = None  # PASS | FAIL | None
    verdict_tolerances: dict[str, float] = field(default_factory=dict)  # rtol/atol of a mismatch
    verification_status: int | None = None
    error_stats: dict[str, float] = field(default_factory=dict)
    printed_outputs: dict[int, list[tuple[str, float | int | bool]]] = field(default_factory=dict)
    etdump_b64: str | None = None
    etdump_complete: bool = False
    eot_seen: bool = False
    program_complete: bool = False
    boots: int = 0  # runner start count; > 1 means the target rebooted mid-run
    printed_elided: set[int] = field(default_factory=set)  # outputs whose printed tensor was cut with '...'
    cpu_time_exceeded: bool = False
    partial_last_line: str | None = None
    # Extensions beyond the shared contract:
    debug_buffer_b64: str | None = None  # ET_DUMP_OUTPUTS debug buffer ('>debug_buffer.bin')
    model_run_ok: bool | None = None  # 'Model run: 0|1'
    simulation_stopped: str | None = None  # reason from 'Info: Simulation is stopping. Reason: ...'
    output_files: list[str] = field(default_factory=list)  # 'Writing output to file: out-0.bin'
    banners: int = 0  # FVP 'Ethos-U rev ...' banners

    @property
    def crashed(self) -> bool:
        """A fatal condition or an F-level line was seen (the runner aborted)."""
        return bool(self.fatal) or any(e.level == "F" for e in self.errors)

    @property
    def causes(self) -> list[LogLine]:
        """E/F lines that can explain a failure (benign ones left out)."""
        return [e for e in self.errors if not BENIGN_RE.search(e.message)]

    def output_arrays(self) -> dict[int, list[float | int | bool]]:
        """Printed outputs as plain value lists, index-ordered."""
        return {i: [v for _, v in vals] for i, vals in sorted(self.printed_outputs.items())}

    def excerpt(self, limit: int = 40) -> list[str]:
        """The lines worth showing for a failure: E/F lines, fatal lines, verdict lines."""
        keep: list[str] = []
        for ln in self.lines:
            msg = ln.message
            if (
                ln.level in ("E", "F")
                or any(r.search(ln.raw) for r in _FATAL_RES)
                or "Test_result" in msg
                or "Simulation is stopping" in ln.raw
                or _STAT_RE.match(msg)
            ):
                keep.append(ln.raw)
        if len(keep) > limit:
            keep = keep[: limit // 2] + [f"... ({len(keep) - limit} lines omitted) ..."] + keep[-limit // 2 :]
        return keep


def parse_line(text: str) -> LogLine:
    """Classify one line (no trailing newline)."""
    m = _RUNNER_RE.match(text.lstrip())
    if m is None:
        # A runner line may follow garbage on the same UART line (e.g. after a reset).
        m2 = re.search(r"(?<![\w\[])[DIEF] \[executorch:", text)
        if m2 is not None:
            m = _RUNNER_RE.match(text[m2.start():])
    if m is None:
        return LogLine(raw=text, level=None, file=None, line=None, func=None, message=text)
    func = m.group("func") or None
    return LogLine(
        raw=text,
        level=m.group("level"),
        file=m.group("file"),
        line=int(m.group("line")),
        func=func,
        message=m.group("msg"),
    )


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _output_value(kind: str | None, value: str) -> tuple[str, float | int | bool]:
    """(kind, value); an untagged value keeps kind "untagged" and takes the bundle's dtype later."""
    if kind is None:
        return "untagged", _number(value)
    kind = kind.lower()
    if kind == "bool":
        return kind, value.lower().startswith("true")
    if kind in ("int", "char", "long", "short", "byte"):
        try:
            return kind, int(value)
        except ValueError:
            number = _number(value)
            return kind, int(number) if math.isfinite(number) else 0
    return kind, _number(value)


class _State:
    """Accumulates a RunnerLog line by line."""

    def __init__(self) -> None:
        self.log = RunnerLog()
        self.in_etdump = False
        self.etdump_parts: list[str] = []
        self.etdump_echo: str | None = None
        self.boot_pending_model = False  # 'Running executor' seen, its 'PTE @' not yet
        self.tensor_text: tuple[int, list[int], list[str]] | None = None  # an `OutputX i: tensor(` being read

    def consume(self, ln: LogLine) -> None:
        log = self.log
        log.lines.append(ln)
        raw = ln.raw
        msg = ln.message
        stripped = raw.strip()

        if self.in_etdump:
            if stripped == "#[END]":
                self.in_etdump = False
                log.etdump_complete = True
                log.etdump_b64 = self.etdump_echo if self.etdump_echo is not None else "".join(self.etdump_parts)
                return
            echo = ECHO_RE.match(stripped)
            if echo:
                if echo.group("name").startswith("debug_buffer"):
                    log.debug_buffer_b64 = "".join(echo.group("b64").split())
                else:
                    self.etdump_echo = "".join(echo.group("b64").split())
            elif ln.level is None and not stripped.startswith("#") and not stripped.startswith("python"):
                # Older runners printed the bare base64 text between the markers.
                self.etdump_parts.append("".join(stripped.split()))
            if ln.level is None:
                return
        elif stripped == "#[RUN THIS]":
            self.in_etdump = True
            self.etdump_parts = []
            self.etdump_echo = None
            log.etdump_b64 = None
            log.etdump_complete = False
            return

        if self.tensor_text is not None and ln.level is None:
            self._tensor_more(stripped)
            return
        if ln.level is None and stripped.startswith("Output["):
            out = _OUTPUT_RE.match(stripped)
            if out:
                self._output(out)
                return
        if ln.level is None and stripped.startswith("Output"):
            start = _TENSOR_START_RE.match(stripped)
            if start:
                sizes = [int(x) for x in start.group("sizes").replace(" ", "").split(",") if x]
                self.tensor_text = (int(start.group("i")), sizes, [])
                self._tensor_more(start.group("rest"))
                return
        if any(marker in raw for marker in _SUCCESS_MARKERS):
            log.program_complete = True
        if ln.level in ("E", "F"):
            log.errors.append(ln)
        if FAULT_RE.search(raw) or _FATAL_ANY.search(raw):
            log.fatal.append(raw)
        if "CPU time has been exceeded" in raw:
            log.cpu_time_exceeded = True
        if "Simulation is stopping. Reason:" in raw:
            log.simulation_stopped = raw.split("Reason:", 1)[1].strip()
        elif "/OSCI/SystemC: Simulation stopped by user" in raw and log.simulation_stopped is None:
            log.simulation_stopped = "Simulation stopped by user."
        if _BANNER_RE.search(raw):
            log.banners += 1

        if ln.level is None:
            return

        # Runner (ET_LOG) lines.
        if msg.startswith(_BOOT_RUNNER):
            log.boots += 1
            self.boot_pending_model = True
        elif _MODEL_START_RE.match(msg):
            if self.boot_pending_model:
                self.boot_pending_model = False
            else:
                log.boots += 1
        verdict = _RESULT_RE.search(msg)
        if verdict:
            log.bundle_verdict = Verdict(verdict.group("verdict"))
        elif "Model output match expected BundleIO bpte ref data" in msg:
            log.bundle_verdict = log.bundle_verdict or Verdict.PASS
        elif "don't match expected BundleIO bpte ref data" in msg:
            log.bundle_verdict = Verdict.FAIL
            tol = _TOL_RE.search(msg)
            if tol:
                log.verdict_tolerances = {"rtol": _number(tol.group("rtol")), "atol": _number(tol.group("atol"))}
        status = _STATUS_RE.search(msg)
        if status:
            text = status.group("status")
            log.verification_status = int(text, 16) if text.lower().startswith("0x") else int(text)
            log.bundle_verdict = Verdict.FAIL
        stat = _STAT_RE.match(msg)
        if stat:
            log.error_stats[stat.group("name")] = _number(stat.group("value"))
        if msg.startswith("Model run:"):
            log.model_run_ok = msg.split(":", 1)[1].strip().startswith("1")
        if msg.startswith("Writing output to file:"):
            log.output_files.append(msg.split(":", 1)[1].strip())

    def _tensor_more(self, text: str) -> None:
        """Collect a printed tensor's values until its closing `])`."""
        assert self.tensor_text is not None
        index, sizes, parts = self.tensor_text
        done = text.endswith("])")
        parts.append(text[:-2] if done else text)
        if not done:
            return
        self.tensor_text = None
        items = [t.strip() for t in " ".join(parts).split(",") if t.strip()]
        if any(t.startswith("...") for t in items):
            self.log.printed_elided.add(index)
            items = [t for t in items if not t.startswith("...")]
        self.log.printed_outputs[index] = [("summary", _number(t)) for t in items]

    def _output(self, out: re.Match) -> None:
        i, j = int(out.group("i")), int(out.group("j"))
        entries = self.log.printed_outputs.get(i, [])
        if i > MAX_PRINTED_OUTPUTS or j > len(entries) + MAX_PRINTED_GAP:
            return  # line noise (a garbled index): padding up to it would take unbounded memory
        self.log.printed_outputs[i] = entries
        kind_value = _output_value(out.group("kind"), out.group("value"))
        if j == len(entries):
            entries.append(kind_value)
        elif j < len(entries):  # repeated inference: keep the latest
            entries[j] = kind_value
        else:  # gap (lost line): pad so indices stay aligned
            entries.extend([("missing", float("nan"))] * (j - len(entries)))
            entries.append(kind_value)

    def snapshot(self) -> RunnerLog:
        log = copy.copy(self.log)
        log.lines = list(log.lines)
        log.errors = list(log.errors)
        log.fatal = list(log.fatal)
        log.printed_outputs = {k: list(v) for k, v in log.printed_outputs.items()}
        log.error_stats = dict(log.error_stats)
        log.verdict_tolerances = dict(log.verdict_tolerances)
        log.output_files = list(log.output_files)
        log.printed_elided = set(log.printed_elided)
        if log.boots == 0 and log.banners:
            log.boots = log.banners
        return log


_CTRL_RE = re.compile(r"[\x00-\x08\x0a-\x1a\x1c-\x1f]")


def _clean(text: str) -> str:
    # NULs, EOT and other C0 controls (except tab and ESC) are line noise from a UART.
    return _CTRL_RE.sub("", text)


class IncrementalLogParser:
    """Feed UART/FVP bytes as they arrive; get complete lines and a running RunnerLog."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = _State()

    def feed(self, chunk: bytes) -> list[LogLine]:
        """Consume `chunk`; return the lines it completed (a trailing CR is held
        back until the next byte shows whether it is part of CRLF)."""
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", errors="replace")
        if EOT in chunk:
            self._state.log.eot_seen = True
        buf = self._buf
        scan_from = max(0, len(buf) - 1)  # only new bytes (and a held-back CR) can end a line
        buf.extend(chunk)
        out: list[LogLine] = []
        start = 0
        for m in _EOL_RE.finditer(buf, scan_from):
            if m.group() == b"\r" and m.end() == len(buf):
                break  # maybe CRLF split across chunks: wait for the next byte
            out.append(self._line(bytes(buf[start : m.start()])))
            start = m.end()
        if start:
            del buf[:start]
        return out

    def _line(self, data: bytes) -> LogLine:
        text = _clean(data.decode("utf-8", errors="replace"))
        ln = parse_line(text)
        self._state.consume(ln)
        return ln

    @property
    def finished(self) -> bool:
        """The session is over: EOT, 'Program complete, exiting.' (outside an
        unfinished ETDump block), or the FVP said the simulation is stopping."""
        st = self._state
        if st.log.eot_seen:
            return True
        if st.log.program_complete and not st.in_etdump:
            return True
        return st.log.simulation_stopped is not None

    @property
    def eot_seen(self) -> bool:
        """The runner's closing EOT byte (0x04) arrived: nothing more will follow."""
        return self._state.log.eot_seen

    @property
    def crashed(self) -> bool:
        return self._state.log.crashed

    def result(self) -> RunnerLog:
        """The log so far; pending bytes count as a partial last line (not consumed)."""
        pending = bytes(self._buf)
        if not pending.strip(b"\r\n\x00\x04"):
            log = self._state.snapshot()
            log.partial_last_line = None
            return log
        saved = self._state
        self._state = copy.copy(saved)
        self._state.log = saved.snapshot()
        try:
            text = _clean(pending.rstrip(b"\r").decode("utf-8", errors="replace"))
            self._state.consume(parse_line(text))
            log = self._state.snapshot()
            log.partial_last_line = text
            return log
        finally:
            self._state = saved


def parse_runner_log(data: str | bytes) -> RunnerLog:
    """Parse a whole saved log (bytes are decoded with errors='replace')."""
    parser = IncrementalLogParser()
    if isinstance(data, str):
        data = data.encode("utf-8", errors="replace")
    parser.feed(data)
    return parser.result()


class EtdumpBlockError(ValueError):
    """The runner's ETDump block cannot be decoded; the message is one line."""


def etdump_block_files(log: RunnerLog) -> tuple[bytes, bytes | None] | None:
    """The files of the runner's `#[RUN THIS]` ... `#[END]` block, decoded: (etdump.bin,
    debug_buffer.bin or None); None when the log has no block. An unfinished block or
    corrupt base64 raises EtdumpBlockError."""
    import base64
    import binascii

    if log.etdump_b64 is None:
        return None
    if not log.etdump_complete:
        raise EtdumpBlockError("the ETDump block is incomplete (no '#[END]': the log was cut short)")

    def decode(text: str, name: str) -> bytes:
        try:
            return base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EtdumpBlockError(f"{name} in the ETDump block is not valid base64 ({exc})") from None

    etdump = decode(log.etdump_b64, "etdump.bin")
    if not etdump:
        raise EtdumpBlockError("the ETDump block holds an empty etdump.bin")
    debug = decode(log.debug_buffer_b64, "debug_buffer.bin") if log.debug_buffer_b64 is not None else None
    return etdump, debug


def debug_buffer_size(log: RunnerLog) -> int | None:
    """The debug buffer size the runner reports setting up (`ETDump: Allocated ... buffer size: N`)."""
    for ln in log.lines:
        m = DEBUG_BUFFER_SIZE_RE.search(ln.message)
        if m:
            return int(m.group("size"))
    return None
