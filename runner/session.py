"""One command's run session: config loaded once, bundles run, judged, reported once.

`Session` is what every command that runs bundles uses (`run`, `validate`,
`accuracy`, `tolerance suggest`): the project config is read once, its
`[targets]` sections and its `[tolerances]` (as the registry for builds) come
from that one file, and `Session.run` writes report.json once with history,
baseline and derived reports folded in.

Whatever happens after the bundle is read (target missing, every case crashing,
Ctrl-C), a report is written before returning, and every case has a verdict.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bundlerun.bundles.errors import BundlerunError, ConfigError
from bundlerun.bundles.limits import MAX_REPORT_OUTPUTS_BYTES
from bundlerun.runner import interrupts
from bundlerun.runner.judging.outcome import EXIT_FAIL, EXIT_PASS
from bundlerun.targets import TargetConfig, TargetURL, open_target, resolve_target
from bundlerun.targets.base import CaseResult, CaseStatus, RunOptions, TargetRun, selected_cases
from bundlerun.targets.failures import FailureKind
from bundlerun.bundles import sequence
from bundlerun.runner import preload
from bundlerun.runner.pictures import warm
from bundlerun.runner.settings import Settings
from bundlerun.targets import repeat_schemes

if TYPE_CHECKING:
    from bundlerun.bundles.bpte import Bundle
    from bundlerun.runner.report.model import Report
    from bundlerun.runner.judging.ahead import JudgeAhead
    from bundlerun.runner.judging.judge import JudgeContext
    from bundlerun.runner.report.record import OutputsWriter

# What judges and writes a run (numpy, the judging modules, the report's records and writers, the history:
# about 60 ms of a command's start-up) is imported where it is used, after the target has started:
# `bundlerun run` on a served lane spawns its runtime first and imports these while it loads (Judging).


def read_bundle_on_file(path: str | Path, require_seal: bool = False, data: bytes | None = None) -> Bundle:
    """bundles/on_file.py's, imported on first use: its parse, manifest and integrity checks are about 20 ms
    of imports, which `bundlerun run` on a served lane pays after its runtime has started (read_for_run)."""
    from bundlerun.bundles.on_file import read_bundle_on_file as read  # start-up: the module comment above

    return read(path, require_seal=require_seal, data=data)


def _bad_zip() -> type[Exception]:
    import zipfile  # start-up: only a run that saves its outputs gets here

    return zipfile.BadZipFile


class RunInterrupted(BundlerunError):
    """Ctrl-C or SIGTERM stopped the run; its report (finished cases kept) is already written.
    Exit code 130 for Ctrl-C, 143 for SIGTERM (runner/interrupts.py)."""

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return interrupts.exit_code()


@dataclass
class RunRequest:
    bundle_path: Path
    target: str
    report_dir: Path
    case_timeout_s: float = 120.0
    setup_timeout_s: float = 300.0
    methods: list[str] | None = None
    cases: list[int] | None = None
    save_outputs: bool = False
    overrides: list[str] = field(default_factory=list)
    label: str | None = None
    target_config: dict[str, Any] = field(default_factory=dict)
    retries: int = 1
    confidence: float = 0.95  # of the dataset accuracy intervals, for bundles with labels
    progress: Callable[[CaseResult], None] | None = None
    on_start: Callable[[int], None] | None = None  # number of cases about to run
    repeat: int = 1  # --repeat N: measured executions per case after one warm-up (targets that support it)
    replay: int = 1  # --replay N: each case run N times, every output compared across runs (runner/judging/replay.py)
    require_seal: bool = False  # --require-seal: an unsealed bundle is refused (runner/seal.py)
    resolved_target: TargetConfig | None = None  # `target` parsed once (the CLI's, or on first use here)

    def url(self) -> "TargetConfig | str":
        """`target` as the one `TargetConfig` this run passes down (resolved on first use); the raw
        string when it does not resolve: the run refuses it with its one line (`_open_or_refuse`)."""
        if self.resolved_target is None or self.resolved_target.raw != self.target:
            try:
                self.resolved_target = resolve_target(self.target)
            except BundlerunError:
                return self.target
        return self.resolved_target


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def apply_overrides(ctx: JudgeContext, bundle: Bundle, overrides: list[str]) -> list[dict[str, Any]]:
    """`--override` strings -> per-output criteria in ctx; returns the records for the report."""
    if not overrides:
        return []
    from bundlerun.runner.judging.overrides import apply_overrides as apply  # the registry's parser

    return apply(ctx, bundle, overrides)


def _loadavg() -> list[float] | None:
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):  # not on every platform
        return None


def perf_conditions(req: RunRequest, run: TargetRun | None, load_before: list[float] | None,
                    warnings: list[str]) -> dict[str, Any]:
    """The report's `perf` beside its summary: repetitions, the warm-up excluded, and the machine's
    load average around the run (a loaded host measures the load, not the model)."""
    import os

    info = (run.info if run is not None else {}) or {}
    out: dict[str, Any] = {"load": {"before": load_before, "after": _loadavg(), "cpus": os.cpu_count()}}
    if req.repeat > 1:
        if info.get("repeat"):
            out.update(repeat=info["repeat"], warmup=info.get("warmup", 0))
        else:
            out["repeat"] = 1

            note = (f"--repeat {req.repeat} not applied: {req.target} runs each case once (repeated "
                    f"executions are supported on {', '.join(s + '://' for s in repeat_schemes())})")
            out["notes"] = [note]
            warnings.append(note)
    return out


class CaseStream:
    """What a run keeps of each case's raw outputs: they go into outputs.npz as they come
    (`--save-outputs`), output 0 is kept for a dataset's top-k, and then the bytes are let go, once
    the case is judged (runner/judging/ahead.py calls `release` on its thread, after judging). A run
    so holds one case's outputs at a time, not every case's (issue 36: dl3's 16 cases are 135 MB of
    outputs). Without a judge ahead (`--replay N` compares every run's outputs at the end, `--repeat`)
    every output stays until the end, and outputs.npz is written then, still a case at a time.

    The run's final results decide what is kept: a case the lane handed over again as another result
    (or gave new outputs after the release) is saved from that one (record.OutputsWriter supersedes),
    and one that ended without outputs keeps none. Released results are held (their outputs are
    gone), so their identity stays theirs to the end of the run."""

    def __init__(self, bundle: Bundle, req: RunRequest, warnings: list[str]) -> None:
        # output 0 of each released case, with the result it came from
        self.first_outputs: dict[str, tuple[CaseResult, Any]] | None = (
            {} if bundle.manifest and bundle.manifest.dataset else None)
        self.outputs: OutputsWriter | None = None
        self.unwritten: OSError | None = None
        self.released: dict[int, CaseResult] = {}  # results whose outputs were saved and let go
        self._lock = threading.Lock()  # `release` runs on the judging thread, `save` and `abandon` on the run's
        if req.save_outputs:
            total = _selected_output_bytes(bundle, req)
            if total > MAX_REPORT_OUTPUTS_BYTES:
                warnings.append(f"--save-outputs: the selected cases' outputs are {total / (1 << 20):,.0f} MiB, more "
                                f"than the {MAX_REPORT_OUTPUTS_BYTES >> 20} MiB a report keeps (bundlerun's bound, "
                                "bundles/limits.py): outputs.npz not written")
            else:
                from bundlerun.runner.report.record import OutputsWriter  # start-up: numpy (module comment)

                try:
                    self.outputs = OutputsWriter(req.report_dir)
                except OSError as exc:
                    self.unwritten = exc

    def _write(self, result: CaseResult) -> None:
        if self.outputs is None:
            return
        try:
            self.outputs.add(result)
        except (OSError, ValueError) as exc:  # a full disk (or a zip it left broken): the run goes on, the report says so
            self.outputs.abandon()
            self.outputs = None
            self.unwritten = exc if isinstance(exc, OSError) else OSError(f"outputs.npz: {exc}")

    def release(self, result: CaseResult, handed: tuple[int, ...]) -> bool:
        """`result` was judged with the outputs `handed` (their identities): save what the report keeps
        of them and let the bytes go; False (kept) when the lane replaced them meanwhile."""
        with self._lock:
            outputs = result.outputs
            if tuple(map(id, outputs)) != handed:
                return False
            self._write(result)
            if self.first_outputs is not None and outputs:
                try:  # the dataset's top-k reads output 0 of each case (runner/judging/accuracy.py): logits
                    self.first_outputs[f"{result.method}/{result.case_index}/0"] = (result, outputs[0].to_array().copy())
                except (ValueError, TypeError, OverflowError):
                    pass
            self.released[id(result)] = result
            result.outputs = []
            return True

    def dataset_outputs(self, run: TargetRun) -> dict[str, Any]:
        """Output 0 of each of the run's final results as the dataset's top-k reads it."""
        kept: dict[str, Any] = {}
        for c in run.cases:
            first = (self.first_outputs or {}).get(f"{c.method}/{c.case_index}/0")
            if c.outputs:
                kept.update({f"{c.method}/{c.case_index}/{j}": r.to_array() for j, r in enumerate(c.outputs)})
            elif first is not None and first[0] is c:
                kept[f"{c.method}/{c.case_index}/0"] = first[1]
        return kept

    def save(self, report: Report, run: TargetRun, report_dir: Path) -> None:
        """outputs.npz in place (or the reason it is not) and its digest in the report."""
        from bundlerun.runner.report.record import OUTPUTS_FILE, note_unwritten  # start-up: numpy (module comment)

        with self._lock:
            for result in run.cases:  # results not let go during the run (or given new outputs since) are saved now
                if result.outputs:
                    self._write(result)
            if self.unwritten is not None:
                note_unwritten(report, Path(report_dir) / OUTPUTS_FILE, self.unwritten)
                return
            if self.outputs is None:
                return  # over the bound: said in the warnings
            try:
                report.outputs_file = str(self.outputs.close(run.cases))
            except (OSError, ValueError, _bad_zip()) as exc:  # the writer took its temp file away
                note_unwritten(report, Path(report_dir) / OUTPUTS_FILE,
                               exc if isinstance(exc, OSError) else OSError(f"outputs.npz: {exc}"))
                return
            finally:
                self.outputs = None
        from bundlerun.runner.history.saved_outputs import file_digest  # `judge` refuses a replaced outputs.npz

        report.outputs_sha256 = file_digest(report.outputs_file)

    def abandon(self) -> None:
        """No outputs.npz: the run stopped before its report (its temp file goes)."""
        with self._lock:
            if self.outputs is not None:
                self.outputs.abandon()
                self.outputs = None


def _selected_output_bytes(bundle: Bundle, req: RunRequest) -> int:
    """Bytes of the expected outputs of the cases this run selects (what the target brings back)."""
    total = 0
    for suite in bundle.method_test_suites:
        if req.methods and suite.method_name not in req.methods:
            continue
        for i, case in enumerate(suite.test_cases):
            if req.cases is None or i in req.cases:
                total += sum(v.nbytes for v in case.expected_outputs)  # not read: a FileValue knows its length
    return total


def _plots_cases(bundle: Bundle, pairs: list[tuple[str, int]]) -> bool:
    """Whether the HTML report will draw a per-case plot (matplotlib): a selected case of a method that is
    not an LLM's sequence (those are drawn without matplotlib, runner/writers/html.py _output_sections). An
    LLM run on a served lane must not import it beside its steps: the import thread held the GIL from the
    thread that triggers each step, 1.07-1.14 -> 1.24-1.30 s for the 192-step run on qemu-user://aarch64
    (bundlerun's own measurement, load 1)."""
    stepped = {s.method for s in sequence.from_manifest(bundle.manifest)}
    return any(method not in stepped for method, _ in pairs)


def execute_run(req: RunRequest, bundle: Bundle | None = None, write: bool = True,
                session: "Session | None" = None, opened: "Opened | None" = None) -> Report:
    """Run and judge; returns the typed report (written to req.report_dir unless `write` is False,
    for a caller that writes it once after adding history and baseline results). `session`: the
    command's, which keeps targets that ask for it open across bundles; otherwise the target is
    opened for this run and closed after it. `opened`: the target `read_for_run` opened with `bundle`
    (its runtime started early), which this run takes over."""
    started, t0 = _now(), time.perf_counter()
    target: Any = opened[0] if opened is not None else None
    open_error: BundlerunError | None = opened[1] if opened is not None else None
    try:  # a target opened early holds a started runtime: let go of whatever stops the run before it runs
        # the bytes stay in the file (bundles/on_file.py): validate, api.run and the farm's jobs hold the structure only
        bundle = bundle or read_bundle_on_file(req.bundle_path, require_seal=req.require_seal)
        if req.require_seal:  # also a bundle read by the caller (bundles/integrity.py)
            from bundlerun.bundles.integrity import require_sealed  # start-up: with the bundle's reader (read_bundle_on_file)

            require_sealed(bundle, str(req.bundle_path))
        warnings: list[str] = []
        judging = Judging(bundle, req, warnings)
        if req.overrides:  # a bad --override is refused before anything runs
            judging.ready()
        if target is None and open_error is None:
            target, open_error = _open_or_refuse(req, session)
        work_dir = Path(req.report_dir) / "work"
        try:
            work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the report folder {work_dir}: {exc.strerror or exc}") from None
        finished: dict[tuple[str, int], CaseResult] = {}  # kept when the user interrupts the run
        stream = CaseStream(bundle, req, warnings)  # outputs saved as they come and let go once judged
        judging.release = stream.release
    except BaseException:
        if target is not None:
            _let_go(target, session)
        raise

    try:  # whatever stops the run (an error, Ctrl-C before the judged part), no temp outputs.npz and no thread stays
        def progress(result: CaseResult) -> None:
            finished[(result.method, result.case_index)] = result
            judging.offer(result)
            if req.progress:
                req.progress(result)

        options = RunOptions(
            work_dir=work_dir,
            case_timeout_s=req.case_timeout_s,
            setup_timeout_s=req.setup_timeout_s,
            methods=req.methods,
            cases=req.cases,
            retries=req.retries,
            config=dict(req.target_config),
            progress=progress,
            repeat=req.repeat if _declares(req.url(), "repeat") else 1,  # a target that cannot is told nothing
            replay=_in_process_replays(bundle, req.replay),  # a stateful sequence: whole runs only (replay.py)
            meanwhile=judging.meanwhile,
        )
        pairs = selected_cases(bundle, options)
        if req.on_start:
            req.on_start(len(pairs))
        run: TargetRun | None = None
        interrupted = False
        load_before = _loadavg()
        refused = None
        try:
            from bundlerun.runner.stateful import refusal  # optional: its failure to load is handled here

            refused = refusal(req.url(), bundle, pairs)  # a stateful sequence this lane would misjudge
            if refused is not None:
                raise refused
            if open_error is not None:
                raise open_error
            if _plots_cases(bundle, pairs):  # the report's per-case plots: matplotlib imported while the target runs
                warm.start()
            run = target.run(bundle, Path(req.bundle_path), options)
            if req.replay > 1:  # runner/judging/replay.py: the target's own loop, else N-1 more whole runs
                from bundlerun.runner.judging.replay import complete  # optional: its failure to load is handled here

                run.info["replay"] = complete(target, req.url(), bundle, Path(req.bundle_path), options, run, req.replay)
        except BundlerunError as exc:
            kind = FailureKind.BAD_CONFIG if isinstance(exc, ConfigError) else getattr(exc, "kind", FailureKind.TOOL_MISSING)
            run = TargetRun(req.target, [
                CaseResult(m, c, CaseStatus.ERROR, error=str(exc), error_kind=kind) for m, c in pairs
            ])
            warnings.append(f"{'refused' if exc is refused else 'target failed'}: {exc}")
        except OSError as exc:  # the host refused the run's own files (logs, outputs): a full disk, a folder gone
            why = f"the host could not write the run's files: {exc.strerror or exc}" + (
                f" ({exc.filename})" if getattr(exc, "filename", None) else "")
            run = TargetRun(req.target, [
                finished.get((m, c)) or CaseResult(m, c, CaseStatus.ERROR, error=why, error_kind=FailureKind.HOST_IO)
                for m, c in pairs
            ])
            warnings.append(why)
        except KeyboardInterrupt:
            # Finished cases keep their results; the rest are marked interrupted.
            interrupted = True
            run = TargetRun(req.target, [
                finished.get((m, c)) or CaseResult(m, c, CaseStatus.ERROR, error="not finished: the run was interrupted",
                                                   error_kind=FailureKind.INTERRUPTED)
                for m, c in pairs
            ])
            warnings.append(f"run {interrupts.describe()} after {len(finished)} of {len(pairs)} cases")
        finally:
            if target is not None:
                _let_go(target, session)
        with interrupts.deferred(hold=True):  # a stop from here on waits until the report is written
            ctx = judging.ready()
            report = _judged_report(req, bundle, run, ctx, warnings, judging.override_records, interrupted, started, t0,
                                    load_before, judging.ahead, stream)
            if write:
                from bundlerun.runner.report.record import write_record  # start-up: numpy (module comment)

                write_record(report, req.report_dir)
        if write:
            interrupts.raise_pending()
        return report
    except BaseException:
        stream.abandon()
        raise
    finally:
        judging.close()


class Judging:
    """What judges a run: its criteria (the manifest's, with the --override records) and the judge that
    runs ahead of the target (runner/judging/ahead.py; not with --replay/--repeat, whose outputs are
    compared at the end, and only once the run's CaseStream gives it `release`). Made by `ready`, once: on
    a thread from the moment the target's runtime is spawned (RunOptions.meanwhile), with the judging's
    imports before it (runner/preload.py), in the host's idle time while the runtime loads and runs; else
    at the first result or the run's end; before the run when there are overrides to check. A result
    handed over while that thread works (`offer`) is held and judged ahead with the next one."""

    def __init__(self, bundle: Bundle, req: RunRequest, warnings: list[str]) -> None:
        self.bundle, self.req, self.warnings = bundle, req, warnings
        self.release: Callable[[CaseResult, tuple[int, ...]], bool] | None = None  # CaseStream.release
        self.ctx: JudgeContext | None = None
        self.override_records: list[dict[str, Any]] = []
        self.ahead: JudgeAhead | None = None
        self._lock = threading.Lock()  # the target may call `ready` from its own thread
        self._prep: threading.Thread | None = None  # meanwhile's
        self._hand = threading.Lock()  # `offer`'s
        self._held: list[CaseResult] = []  # results offered while `_prep` worked

    def ready(self) -> JudgeContext:
        prep = self._prep
        if prep is not None and prep is not threading.current_thread():
            prep.join()  # its imports done first: no two threads import the judging's modules at once
        with self._lock:
            if self.ctx is None:
                from bundlerun.runner.judging.blas_threads import import_numpy  # start-up: numpy (module comment)

                import_numpy()  # first, with one OpenBLAS thread: its spin would take the starting runtime's core
                from bundlerun.runner.judging.judge import load_context  # start-up: numpy (module comment)

                ctx = load_context(self.bundle)
                self.override_records = apply_overrides(ctx, self.bundle, self.req.overrides)
                self.warnings[0:0] = ctx.warnings  # first, as they were before anything ran
                self.ctx = ctx
            if self.ahead is None and self.release is not None and self.req.replay <= 1 and self.req.repeat <= 1:
                from bundlerun.runner.judging.ahead import JudgeAhead  # start-up: numpy (module comment)

                self.ahead = JudgeAhead(self.bundle, self.ctx, after=self.release)
            return self.ctx

    def offer(self, result: CaseResult) -> None:
        """A finished case (the run's progress): judged ahead on JudgeAhead's thread, with any held before
        it; held while `meanwhile`'s thread is still at work, so the target's loop never waits for it. A
        held case the run ends before handing over another is judged with the report."""
        with self._hand:
            prep = self._prep
            if prep is not None and prep.is_alive():
                self._held.append(result)
                return
            held, self._held = [*self._held, result], []
        self.ready()
        if self.ahead is not None:
            for each in held:
                self.ahead.submit(each)  # an OK result; any other is judged when taken

    def meanwhile(self) -> None:
        """RunOptions.meanwhile (the target's runtime is spawned): made ready on a daemon thread, after the
        judging's and the report formats' imports (runner/preload.py; write_reports loads the formats at the
        end otherwise)."""
        with self._hand:
            if self._prep is None and self.ctx is None:
                self._prep = threading.Thread(target=self._prepare, name="judging-prepare", daemon=True)
                self._prep.start()

    def _prepare(self) -> None:
        try:
            preload.imports()
            self.ready()
        except Exception:  # noqa: BLE001 - raised again where the run calls `ready`, as it always was
            pass

    def close(self) -> None:
        if self._prep is not None:
            self._prep.join(10.0)  # imports: no thread of the run stays (bounded: nothing here waits on the run)
        with self._lock:
            if self.ahead is not None:
                self.ahead.close()


def _in_process_replays(bundle: Bundle, n: int) -> int:
    if n <= 1:
        return 1
    from bundlerun.runner.judging.replay import in_process_replays  # start-up: numpy (module comment)

    return in_process_replays(bundle, n)


def _starts_early(req: RunRequest) -> bool:
    """Whether this run may start its target's runtime before the bundle is read and verified: the target
    declares `prestart`, and nothing must be refused before anything runs (an unsealed bundle under
    --require-seal, a bad --override) nor needs a process per case or run (--repeat, --replay)."""
    return (not req.require_seal and not req.overrides and req.repeat <= 1 and req.replay <= 1
            and _declares(req.url(), "prestart"))


Opened = tuple[Any, "BundlerunError | None"]  # a run's target and the error that kept it from opening


def read_for_run(req: RunRequest, session: "Session | None") -> tuple[Bundle, Opened | None]:
    """The run's bundle, read and verified (read_bundle_on_file), with its target opened and its runtime
    started on the bundle's bytes meanwhile where the run allows (`_read_starting_early`); pass both to
    execute_run, which takes the target over (and lets go of it whatever stops the run)."""
    if _starts_early(req):
        bundle, target, open_error = _read_starting_early(req, session)
        return bundle, (target, open_error) if target is not None or open_error is not None else None
    return read_bundle_on_file(req.bundle_path, require_seal=req.require_seal), None


def _read_starting_early(req: RunRequest, session: "Session | None") -> tuple[Bundle, Any, BundlerunError | None]:
    """The bundle read and verified while the target's runtime starts on its bytes (TargetSpec.prestart):
    the file is read once, its one method's name peeked (bundles/bpte.py method_names), the target opened
    and its runtime spawned on those bytes, and then those same bytes parsed and verified, as
    read_bundle_on_file does, while the runtime loads. The runtime is vouched for, and adopted by the run,
    only once the bundle is verified; a bundle that fails lets go of the target (its runtime killed and
    reaped) and raises as ever. On the 192-step tiny llama run on qemu-user://aarch64 the emulator was
    spawned ~40 ms earlier (the bundle's reading and checks, the run's set-up), while the judging's
    imports moved to a thread (runner/preload.py): bundlerun's own measurement. Returns the
    target and its open error; no target (None, None) when none was opened here (a bundle of several
    methods, a --method it does not hold, a URL refused: the run opens it as ever, after the bundle)."""
    from bundlerun.bundles.bpte_bytes import method_names, read_bundle_bytes  # start-up: not bpte.py's imports (module)
    from bundlerun.bundles.errors import BundleError  # start-up: loaded on use, not with the CLI

    path = Path(req.bundle_path)
    data = read_bundle_bytes(path, writable=True)
    try:
        names = method_names(data, str(path))
    except BundleError:
        names = []  # the read below says what is wrong
    target: Any = None
    open_error: BundlerunError | None = None
    if len(names) == 1 and (not req.methods or list(req.methods) == names):
        try:
            target, open_error = _open_or_refuse(req, session)
        except ConfigError:
            pass  # refused by the run's own open, after the bundle's checks, as ever
    early = None
    work = Path(req.report_dir) / "work"
    made = next((folder for folder in (work, *work.parents)[::-1] if not folder.exists()), None)
    try:
        if target is not None and open_error is None:
            try:
                early = target.prestart(data, names[0], work)
            except (BundlerunError, OSError):
                early = None  # the run's own start says what is wrong (no runner, no emulator, a folder refused)
        bundle = read_bundle_on_file(path, data=data)
    except BaseException:
        if target is not None:
            _let_go(target, session)
        if early is not None and made is not None:
            shutil.rmtree(made, ignore_errors=True)  # no report folder is made of a bundle that fails its checks
        raise
    if early is not None:
        early.vouch(bundle)
    return bundle, target, open_error


def _let_go(target: Any, session: "Session | None") -> None:
    """The run is done with its target: the session keeps it or it is closed."""
    session.release(target) if session else _close_quietly(target)


def _open_or_refuse(req: RunRequest, session: "Session | None") -> tuple[Any, BundlerunError | None]:
    """Open the run's target before anything is written. A URL that does not parse or names no
    target (unknown scheme, variant, machine; a bad option) never reaches a target: refused here
    with its one line, so no report folder, no ERROR per case and no history row is made of a typo.
    Any other failure to open (a tool missing, a device away) is the run's finding: returned, and
    reported for every case."""
    try:
        url = req.url()
        target = session.open_target(url, req.target_config) if session else open_target(url, req.target_config)
    except ConfigError:
        raise
    except BundlerunError as exc:
        if getattr(exc, "kind", None) in (FailureKind.BAD_CONFIG, FailureKind.BAD_CONFIG.value):
            raise ConfigError(str(exc)) from None
        return None, exc
    return target, None


def _judged_report(req: RunRequest, bundle: Bundle, run: TargetRun, ctx: JudgeContext, warnings: list[str],
                   override_records: list[dict[str, Any]], interrupted: bool, started: str, t0: float,
                   load_before: list[float] | None, ahead: Any = None, stream: CaseStream | None = None) -> Report:
    """Judge the target's run and build the report of record."""
    from bundlerun.runner.judging.judge import judge_run, judge_sequences, summarize  # start-up: numpy (module comment)
    from bundlerun.runner.report.record import bundle_section, host_section, target_section, tool_version  # the same
    from bundlerun.runner.report.model import Report, elapsed_figures  # the same

    warnings += [w for w in run.warnings if w not in warnings]
    cases, judge_warnings = judge_run(bundle, run, ctx, ahead)
    warnings += [w for w in judge_warnings if w not in warnings]
    summary = summarize(cases)
    if interrupted:
        summary.interrupted, summary.exit_code = True, interrupts.exit_code()
    report = Report(
        summary=summary,
        cases=cases,
        tool={"name": "bundlerun", "version": tool_version()},
        run={
            "id": uuid.uuid4().hex,
            "label": req.label,
            "started": started,
            "finished": _now(),
            "duration_s": time.perf_counter() - t0,
            "command": sys.argv,
            "host": host_section(),
        },
        bundle=bundle_section(Path(req.bundle_path), bundle.manifest, bundle),
        target=target_section(run, req.target),
        overrides=override_records,
        warnings=warnings,
        perf_info=perf_conditions(req, run, load_before, warnings),
    )
    elapsed_figures(report.cases, req.url())  # each finished case's elapsed_s as a labelled figure
    report.sequences = judge_sequences(ctx, cases)  # LLM bundles: per-step token verdicts ([] otherwise)
    from bundlerun.runner.history.series import criteria_digest  # which criteria judged it: part of the run's series

    report.bundle["criteria_sha256"] = criteria_digest(report.cases)
    if req.replay > 1 and not interrupted:  # runner/judging/replay.py: distinct results, spread and flips per output
        from bundlerun.runner.judging.replay import add_to_report  # start-up: numpy (module comment)

        add_to_report(report, bundle, run, ctx, req.replay, (run.info or {}).get("replay") or {})
    if any(c.extra.get("etdump") for c in cases):  # operator profiles (runner/report/profile.py)
        from bundlerun.runner.report.profile import method_profiles  # start-up: statistics (module comment)

        report.perf_info["profile"] = method_profiles(cases)
    if bundle.manifest and bundle.manifest.dataset:
        from bundlerun.runner.judging.accuracy import dataset_from_outputs  # start-up: numpy (module comment)

        outputs = stream.dataset_outputs(run) if stream is not None else {
            f"{c.method}/{c.case_index}/{j}": r.to_array() for c in run.cases for j, r in enumerate(c.outputs)}
        report.dataset = dataset_from_outputs(bundle, outputs, req.confidence)
    if req.save_outputs:
        (stream or CaseStream(bundle, req, report.warnings)).save(report, run, req.report_dir)
    return report


def finish_run(
    report: Report,
    report_dir: Path,
    bundle: Any,
    project: dict[str, Any],
    baseline: str | None = None,
    history_db: Path | str | None = None,
    no_history: bool = False,
) -> Report:
    """After a run (plain or accuracy): record it in the history, check it against a
    baseline (a regression makes the exit code 1), and write every registered format,
    report.json last with all of that in it."""

    from bundlerun.runner.history.location import is_server, resolve_history_path  # start-up: module comment
    from bundlerun.runner.history.regression import check_baseline  # the same

    db = None if no_history else resolve_history_path(history_db, project)
    if db is not None:
        from bundlerun.runner.history import store as history  # start-up: loads SQLAlchemy, for a run it records only

        try:
            report.run["history_id"] = history.record_report(db, report, report_path=Path(report_dir) / "report.json")
        except Exception as exc:  # noqa: BLE001 - history (a locked or unwritable db) never changes a verdict
            report.warnings.append(f"history not recorded in {db}: {type(exc).__name__}: {exc}")
            if is_server(db):  # a shared history the team reads lost this run: exit 2 (console.exit_code)
                report.run["history_error"] = f"history not recorded: {exc}"
            db = None
    if baseline:
        report.regressions = check_baseline(baseline, report, db, project)
        if report.regressions and report.summary.exit_code == EXIT_PASS:
            report.summary.exit_code = EXIT_FAIL
    from bundlerun.runner.writers import write_reports  # start-up: numpy (module comment)

    write_reports(report, Path(report_dir), bundle=bundle, history_db=db)  # report.json last, listing the rest
    return report


def _declares(url: str | TargetURL, capability: str) -> bool:
    """Whether the target at `url` declares a boolean capability (`repeat`, `keep_open`)."""
    try:
        return bool(getattr(resolve_target(url).declared, capability))
    except BundlerunError:
        return False  # the run reports the bad URL


def _keeps_open(url: str | TargetURL) -> bool:
    return _declares(url, "keep_open")


def _close_quietly(target: Any) -> None:
    try:
        target.close()
    except Exception:  # noqa: BLE001 - closing never changes a verdict
        pass


@dataclass
class Session(Settings):
    """The context of one command: project config (read once), target options (runner/settings.py),
    history and baseline.

    An open session (`with session:` or `open()` ... `close()`; the CLI ties it to the command)
    also owns what is worth keeping between the bundles of a command: the opened targets and
    the warm runtime workers (targets.workers.supervisor.WorkerPool: torch and the runtime are
    imported once per target instead of once per bundle). `close()` kills and reaps every
    worker and closes the targets; a session that was never opened starts one child per bundle."""

    history_db: Path | str | None = None
    no_history: bool = False
    baseline: str | None = None
    _pool: Any = field(default=None, repr=False)
    _targets: dict = field(default_factory=dict, repr=False)

    def open(self) -> "Session":
        """Start keeping targets and warm workers for the bundles of this command."""
        if self._pool is None:
            from bundlerun.targets.workers.supervisor import WorkerPool  # start-up: loaded on use, not with the module

            self._pool = WorkerPool()
        return self

    def close(self) -> None:
        """Kill and reap every warm worker, close every target kept open. Idempotent."""
        pool, self._pool = self._pool, None
        targets, self._targets = list(self._targets.values()), {}
        try:
            if pool is not None:
                pool.close()
        finally:
            for target in targets:
                _close_quietly(target)

    def __enter__(self) -> "Session":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def workers(self):
        """The warm worker pool while the session is open (None otherwise)."""
        return self._pool

    def open_target(self, url: str | TargetURL, config: dict[str, Any]):
        """The target for `url` + `config`. In an open session a target whose module declares
        `keep_open` (it holds something worth keeping between bundles: a connection, a booted
        device) is opened once per URL and settings and closed with the session; any other is
        opened for its bundle and closed after it (`release`)."""
        if self._pool is None or not _keeps_open(url):
            return open_target(url, config)
        import json

        key = (str(url), json.dumps(config, sort_keys=True, default=str))
        if key not in self._targets:
            self._targets[key] = open_target(url, config)
        return self._targets[key]

    def release(self, target: Any) -> None:
        """A bundle is done with `target`: closed now unless the session keeps it open."""
        if not any(kept is target for kept in self._targets.values()):
            _close_quietly(target)

    def _configure(self, req: RunRequest) -> None:
        if not req.target_config:
            req.target_config = self.target_config(req.url())

    def execute(self, req: RunRequest, bundle: Bundle | None = None, opened: Opened | None = None) -> Report:
        """Run and judge one bundle with this session's targets and warm workers; nothing is written
        (`run` adds history, baseline and the report files; a farm worker leaves those to its
        coordinator, which records each job once after its retries). `opened`: see execute_run."""
        self._configure(req)
        if self._pool is None:
            return execute_run(req, bundle=bundle, write=False, opened=opened)
        with self._pool.activate():
            return execute_run(req, bundle=bundle, write=False, session=self, opened=opened)

    def run(self, req: RunRequest, bundle: Bundle | None = None,
            amend: Callable[[Report], None] | None = None) -> Report:
        """Run, judge (`amend` adds to the report), record history, check the baseline, write every
        report: report.json once. Without `bundle`, req.bundle_path is read here (`read_for_run`: the
        target's runtime may start while it is read)."""
        opened = None
        if bundle is None:
            self._configure(req)
            bundle, opened = read_for_run(req, self if self._pool is not None else None)
        try:
            report = self.execute(req, bundle, opened)
        except BaseException:
            if opened is not None and opened[0] is not None:
                self.release(opened[0])  # a stop before the run took it over (idempotent after)
            raise
        with interrupts.deferred():  # a stop during history/baseline/reports is raised once they are written
            if amend is not None:
                amend(report)
            try:
                report = finish_run(report, req.report_dir, bundle or req.bundle_path, self.project, self.baseline,
                                    self.history_db, self.no_history)
            except BaseException:
                from bundlerun.runner.report.record import write_record  # start-up: numpy (module comment)

                write_record(report, req.report_dir)  # whatever failed after judging, the verdicts are kept
                raise
        if report.summary.interrupted:
            raise RunInterrupted(f"{interrupts.describe()}; the report of the finished cases is in "
                                 f"{Path(req.report_dir) / 'report.json'}")
        return report
