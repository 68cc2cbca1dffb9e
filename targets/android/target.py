"""AndroidTarget: deploy, run every case, pull every output, classify every failure."""

from __future__ import annotations

import posixpath
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from bundlerun.bundles.bpte import Bundle, serialize_bundle
from bundlerun.bundles.errors import TargetError
from bundlerun.bundles.fileio import atomic_write_bytes
from bundlerun.targets.et_runner import executor_runner
from bundlerun.targets.android import profiles
from bundlerun.targets.android.config import AndroidTargetConfig
from bundlerun.targets.remote.device_cache import Artifact, DeviceCache
from bundlerun.targets.remote.transport import MISSING_FILE, TIMEOUT, Transport, TransportError, failure_kind, shell
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.base import (CaseResult, CaseStatus, RunOptions, TargetBase, TargetRun, raw_outputs_from_files,
                                    selected_cases)
from bundlerun.targets.et_runner.server import stateful_methods

_LOG_HINT = re.compile(r"(^[EF] |error|Error|ERROR|fault|Fault|dlopen|CANNOT LINK|not found|Abort|Segmentation|Test_result)")


@dataclass
class _Exec:
    output: str
    exit_status: int | None
    timed_out: bool
    elapsed_s: float
    command: str


@dataclass
class _Budget:
    """Transport retries left for one case (or one qnn process); shared by a whole-case
    retry and a pull-only retry, so the total stays bounded by `retries`."""

    left: int
    used: int = 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.used += 1
        return True


def _excerpt(log: str, limit: int = 20) -> list[str]:
    lines = [l for l in log.splitlines() if l.strip()]
    hits = [l for l in lines if _LOG_HINT.search(l)]
    return (hits or lines)[-limit:]


class AndroidTarget(TargetBase):
    def __init__(self, url: str, transport: Transport, config: AndroidTargetConfig):
        self.url = url
        self.transport = transport
        self.cfg = config

    # -- helpers
    def _log_dir(self, options: RunOptions) -> Path:
        d = Path(options.work_dir) / "android"
        (d / "logs").mkdir(parents=True, exist_ok=True)
        return d

    def _exec(self, command: str, timeout_s: float, run_dir: str) -> _Exec:
        t0 = time.monotonic()
        try:
            res = shell(self.transport, command, timeout_s)
        except TransportError as exc:
            if exc.kind != TIMEOUT:
                raise
            elapsed = time.monotonic() - t0
            self._kill_runner(run_dir)
            return _Exec(exc.output, None, True, elapsed, command)
        return _Exec(res.output, res.exit_status, False, time.monotonic() - t0, command)

    def _kill_runner(self, run_dir: str) -> None:
        """After a timeout: reconnect and kill the runner by the pid it recorded."""
        try:
            self.transport.reconnect()
            pidfile = shlex.quote(posixpath.join(run_dir, ".runner.pid"))
            shell(self.transport, f"[ -f {pidfile} ] && kill -9 $(cat {pidfile}) 2>/dev/null; true", self.cfg.command_timeout_s)
        except TransportError:
            pass

    def _logcat(self, arg: str) -> str | None:
        """`logcat -c` / `logcat -d` when enabled (runners built with the Android PAL log there)."""
        if not self.cfg.logcat:
            return None
        try:
            return shell(self.transport, f"logcat {arg}", self.cfg.command_timeout_s).output
        except TransportError as exc:
            return f"(logcat unavailable: {exc})"

    def _save_log(self, path: Path, ex: _Exec | None, extra: str | None = None) -> str:
        text = ""
        if ex is not None:
            status = "timed out" if ex.timed_out else f"exit status {ex.exit_status}"
            text = f"$ {ex.command}\n{ex.output}\n[{status} after {ex.elapsed_s:.2f} s]\n"
        if extra is not None:
            text += f"--- logcat ---\n{extra}\n"
        atomic_write_bytes(path, text.encode("utf-8", "replace"))
        return str(path)

    def _base_artifacts(self, runner_name: str, extra_libs: list[Path]) -> list[Artifact]:
        if self.cfg.runner is None:
            raise TargetError(f"[targets.adb] runner is not set: give the host path of the Android {runner_name} "
                              "(built by firmware_scripts/android/build_executor_runner.sh)")
        if not Path(self.cfg.runner).is_file():
            raise TargetError(f"runner binary {self.cfg.runner} does not exist")
        arts = [Artifact(Path(self.cfg.runner), runner_name)]
        for lib in list(self.cfg.libraries) + extra_libs:
            if not Path(lib).is_file():
                raise TargetError(f"library {lib} does not exist")
            arts.append(Artifact(Path(lib), Path(lib).name))
        return arts

    def _device_prop(self, name: str) -> str | None:
        try:
            res = shell(self.transport, f"getprop {shlex.quote(name)} 2>/dev/null", self.cfg.command_timeout_s)
        except TransportError:
            return None
        value = res.output.strip()
        return value if res.exit_status == 0 and value else None

    # -- entry point
    def run(self, bundle: Bundle, bundle_path: Path, options: RunOptions) -> TargetRun:
        t0 = time.monotonic()
        pairs = selected_cases(bundle, options)

        stateful = sorted(stateful_methods(bundle) & {m for m, _ in pairs})
        if stateful:  # the LLM contract: a decode step is never run on a fresh method
            raise TargetError(f"method {stateful[0]!r} holds a stateful sequence (its KV cache carries from case to "
                              "case) and adb:// runs one runner process per case: refused, a step is never run on a "
                              "fresh method (run it on qemu-user://aarch64, which serves the sequence on one method)",
                              kind="bad-config")
        retries = self.cfg.retries if self.cfg.retries is not None else options.retries
        cache = DeviceCache(self.transport, self.cfg.workspace, self.cfg.command_timeout_s, self.cfg.transfer_timeout_s)
        info = {"transport": self.transport.description, "profile": self.cfg.profile, "workspace": self.cfg.workspace}
        logs_dir = self._log_dir(options)
        try:
            self._with_retries(retries, self.transport.connect)
            info["device_model"] = self._device_prop("ro.product.model")
            if self.cfg.profile == "qnn-executor-runner":
                htp = profiles.resolve_htp_arch(self.cfg, None if (self.cfg.htp_arch or self.cfg.soc_model)
                                                else self._device_prop("ro.soc.model"))
                info["htp_arch"] = htp
                base = self._base_artifacts("qnn_executor_runner", profiles.qnn_libraries(self.cfg, htp))
            else:
                base = self._base_artifacts("executor_runner", [])
            self._with_retries(retries, lambda: cache.ensure(base))
        except TransportError as exc:  # device/link problem: every case gets the classified error
            self.transport.close()
            results = [self._setup_failure(m, i, exc, logs_dir) for m, i in pairs]
            self._emit(results, options)
            return TargetRun(self.url, results, info={**info, "error": str(exc)}, setup_s=time.monotonic() - t0)
        except TargetError:  # configuration problem (no runner, no QNN SDK): nothing can run
            self.transport.close()
            raise
        setup_s = time.monotonic() - t0
        try:
            if self.cfg.profile == "qnn-executor-runner":
                results = self._run_qnn(bundle, pairs, base, cache, options, retries, logs_dir)
            else:
                if getattr(options, "repeat", 1) > 1:  # --repeat N: one warm-up + N measured executions per case
                    info.update(repeat=options.repeat, warmup=1,
                                num_executions=executor_runner.executions_for(options.repeat))
                results = self._run_executor_runner(bundle, pairs, base, cache, options, retries, logs_dir)
            try:
                info["pruned"] = cache.prune(int(self.cfg.cache_max_mb * 1024 * 1024), cache.used)
            except TransportError as exc:  # housekeeping only: never fails the run
                info["prune_error"] = str(exc)
        finally:
            self.transport.close()
        info.update(pushed=list(cache.pushed), reused=sorted(set(cache.reused)))
        return TargetRun(self.url, results, info=info, logs={"dir": str(logs_dir / "logs")}, setup_s=setup_s)

    def _emit(self, results: list[CaseResult], options: RunOptions) -> None:
        if options.progress:
            for r in results:
                options.progress(r)

    def _with_retries(self, retries: int, fn):
        attempt = 0
        while True:
            try:
                return fn()
            except TransportError as exc:
                if not exc.transient or attempt >= retries:
                    raise
                attempt += 1
                self._reconnect_quietly()

    def _setup_failure(self, method: str, index: int, exc: TransportError, logs_dir: Path) -> CaseResult:
        path = logs_dir / "logs" / "setup.log"
        atomic_write_bytes(path, f"{exc}\n{exc.output}\n".encode("utf-8", "replace"))
        excerpt = [str(exc)] + _excerpt(exc.output, 10)
        status = CaseStatus.TIMEOUT if exc.kind == TIMEOUT else CaseStatus.ERROR
        return CaseResult(method, index, status, error=str(exc), error_kind=failure_kind(exc.kind), log_excerpt=excerpt,
                          log_path=str(path),
                          extra={"transport_fault": exc.kind})

    def _case_error(self, method: str, index: int, exc: TransportError, log_path: str | Path) -> CaseResult:
        """A case lost to the device or the link; what the device said is appended to the case log."""
        path = Path(log_path)
        previous = path.read_text(errors="replace") if path.exists() else ""
        atomic_write_bytes(path, (previous + f"--- {exc.kind}: {exc}\n{exc.output}\n").encode("utf-8", "replace"))
        status = CaseStatus.TIMEOUT if exc.kind == TIMEOUT else CaseStatus.ERROR
        return CaseResult(method, index, status, error=str(exc), error_kind=failure_kind(exc.kind),
                          log_excerpt=[str(exc)] + _excerpt(exc.output, 10), log_path=str(path),
                          extra={"transport_fault": exc.kind})

    # -- executor-runner: one bundle, one process per case
    def _run_executor_runner(self, bundle, pairs, base, cache, options, retries, logs_dir) -> list[CaseResult]:
        results = []
        run_dir = posixpath.join(self.cfg.workspace, "run")
        for method, index in pairs:
            case_file = logs_dir / "bundles" / f"{_safe(method)}-{index}.bpte"
            atomic_write_bytes(case_file, serialize_bundle(bundle.single_case(method, index)))
            log_path = logs_dir / "logs" / f"{_safe(method)}-{index}.log"
            budget = _Budget(retries)
            while True:
                try:
                    result = self._one_case(bundle, method, index, base + [Artifact(case_file, "model.bpte")],
                                            cache, run_dir, options, log_path, logs_dir, budget)
                    break
                except TransportError as exc:
                    if exc.transient and budget.take():
                        self._reconnect_quietly()
                        continue
                    result = self._case_error(method, index, exc, log_path)
                    break
            result.extra["attempts"] = budget.used + 1
            results.append(result)
            self._emit([result], options)
        return results

    def _reconnect_quietly(self) -> None:
        try:
            self.transport.reconnect()
        except TransportError:
            pass

    def _pull(self, remote: str, local: Path, budget: _Budget) -> None:
        """Pull with its own retries: the outputs are still on the device, so a cut
        transfer does not need the case to run again."""
        while True:
            try:
                return self.transport.pull(remote, local, self.cfg.transfer_timeout_s)
            except TransportError as exc:
                if not (exc.transient and budget.take()):
                    raise
                self._reconnect_quietly()

    def _one_case(self, bundle, method, index, arts, cache, run_dir, options, log_path, logs_dir, budget) -> CaseResult:
        paths = cache.ensure(arts)
        cache.prepare_run_dir(run_dir, paths, ["out"])
        env = {"LD_LIBRARY_PATH": ".", **self.cfg.env}
        etdump = "out/model.etdump" if self.cfg.etdump else None
        c = self.cfg
        args = executor_runner.runner_args("model.bpte", method, "out/output", rtol=c.bundleio_rtol, atol=c.bundleio_atol,
                                           num_executions=executor_runner.executions_for(
                                               getattr(options, "repeat", 1), c.num_executions),
                                           print_output=c.print_output,
                                           cpu_threads=c.cpu_threads, etdump=etdump)
        self._logcat("-c")
        ex = self._exec(profiles.runner_command(run_dir, "executor_runner", args, env), options.case_timeout_s, run_dir)
        logcat_text = self._logcat("-d")
        log = self._save_log(log_path, ex, logcat_text)
        logcat = logcat_text or ""
        verdict = executor_runner.device_verdict(ex.output + logcat)
        excerpt = _excerpt(ex.output + "\n" + logcat)
        if ex.timed_out:
            return CaseResult(method, index, CaseStatus.TIMEOUT, error=f"the runner did not finish within {options.case_timeout_s:g} s",
                              error_kind=FailureKind.HOST_TIMEOUT, log_excerpt=excerpt, log_path=log, elapsed_s=ex.elapsed_s)
        problem = executor_runner.classify(ex.output + "\n" + logcat, ex.exit_status)
        if problem:
            return CaseResult(method, index, problem.status, error=problem.message, error_kind=problem.kind,
                              log_excerpt=problem.evidence or excerpt, log_path=log, elapsed_s=ex.elapsed_s,
                              device_verdict=verdict)
        case = bundle.suite(method).test_cases[index]
        tensor_slots = [k for k, v in enumerate(case.expected_outputs) if v.kind == "tensor"]
        layout = [(case.expected_outputs[k].scalar_type, list(case.expected_outputs[k].sizes)) for k in tensor_slots]
        local_dir = logs_dir / "outputs" / f"{_safe(method)}-{index}"
        local_dir.mkdir(parents=True, exist_ok=True)
        files = []
        for k in tensor_slots:
            local = local_dir / f"output-{k}.bin"
            try:
                self._pull(posixpath.join(run_dir, "out", f"output-{k}.bin"), local, budget)
            except TransportError as exc:
                if exc.kind != MISSING_FILE:
                    raise
                return CaseResult(method, index, CaseStatus.ERROR, error=f"the runner wrote no output-{k}.bin ({exc})",
                                  error_kind=FailureKind.MISSING_OUTPUT, log_excerpt=excerpt, log_path=log,
                                  elapsed_s=ex.elapsed_s, device_verdict=verdict)
            files.append(local)
        outputs, err = raw_outputs_from_files(files, layout)
        if err:
            return CaseResult(method, index, CaseStatus.ERROR, error=err, error_kind=FailureKind.WRONG_OUTPUT_SIZE,
                              log_excerpt=excerpt, log_path=log, elapsed_s=ex.elapsed_s, device_verdict=verdict)
        result = CaseResult(method, index, CaseStatus.OK, outputs=outputs, log_excerpt=excerpt, log_path=log,
                            elapsed_s=ex.elapsed_s, device_verdict=verdict)
        result.add_perf(executor_runner.perf_figures(ex.output + "\n" + logcat))
        if etdump:
            result.extra["etdump"] = self._pull_optional(posixpath.join(run_dir, etdump), local_dir / "model.etdump", budget)
        return result

    def _pull_optional(self, remote: str, local: Path, budget: _Budget) -> str | None:
        """An artifact the run may or may not have produced (ETDump): None when absent."""
        try:
            self._pull(remote, local, budget)
        except TransportError as exc:
            if exc.kind != MISSING_FILE:
                raise
            return None
        return str(local)

    # -- qnn-executor-runner: plain .pte + raw inputs, all cases in one process per method
    def _run_qnn(self, bundle, pairs, base, cache, options, retries, logs_dir) -> list[CaseResult]:
        results: list[CaseResult] = []
        methods = [s.method_name for s in bundle.method_test_suites]
        qdir = logs_dir / "qnn"
        pte = qdir / "model.pte"
        atomic_write_bytes(pte, bytes(bundle.program))
        for method in dict.fromkeys(m for m, _ in pairs):
            cases = [i for m, i in pairs if m == method]
            budget = _Budget(retries)
            while True:
                try:
                    res = self._qnn_method(bundle, method, methods.index(method), cases, base, pte, cache, options,
                                           logs_dir, budget)
                    break
                except TransportError as exc:
                    if exc.transient and budget.take():
                        self._reconnect_quietly()
                        continue
                    log = logs_dir / "logs" / f"{_safe(method)}-qnn.log"
                    res = [self._case_error(method, i, exc, log) for i in cases]
                    break
            for r in res:
                r.extra["attempts"] = budget.used + 1
            results += res
            self._emit(res, options)
        return results

    def _qnn_method(self, bundle, method, method_index, cases, base, pte, cache, options, logs_dir, budget) -> list[CaseResult]:
        suite = bundle.suite(method)
        qdir = logs_dir / "qnn" / _safe(method)
        qdir.mkdir(parents=True, exist_ok=True)
        arts = base + [Artifact(pte, "model.pte")]
        lines, links = [], {}
        for line_no, index in enumerate(cases):
            names = []
            for j, value in enumerate(suite.test_cases[index].inputs):
                if value.kind != "tensor":
                    continue
                local = qdir / f"input_{index}_{j}.raw"
                atomic_write_bytes(local, bytes(value.data))
                arts.append(Artifact(local, local.name))
                names.append(f"inputs/{local.name}")
            lines.append(" ".join(names))
        input_list = qdir / "input_list.txt"
        atomic_write_bytes(input_list, ("\n".join(lines) + "\n").encode())
        arts.append(Artifact(input_list, "input_list.txt"))
        paths = cache.ensure(arts)
        run_dir = posixpath.join(self.cfg.workspace, "run")
        for name, remote in paths.items():
            links[f"inputs/{name}" if name.startswith("input_") and name.endswith(".raw") else name] = remote
        cache.prepare_run_dir(run_dir, links, ["inputs", "outputs"])
        env = {"LD_LIBRARY_PATH": ".", "ADSP_LIBRARY_PATH": ".", **self.cfg.env}
        etdump = "outputs/model.etdump" if self.cfg.etdump else None
        args = profiles.qnn_runner_args(method_index, etdump)
        log_path = logs_dir / "logs" / f"{_safe(method)}-qnn.log"
        self._logcat("-c")
        ex = self._exec(profiles.runner_command(run_dir, "qnn_executor_runner", args, env),
                        options.case_timeout_s * max(1, len(cases)), run_dir)
        logcat_text = self._logcat("-d")
        log = self._save_log(log_path, ex, logcat_text)
        logcat = logcat_text or ""
        excerpt = _excerpt(ex.output + "\n" + logcat)
        per_case = ex.elapsed_s / max(1, len(cases))
        if ex.timed_out:
            return [CaseResult(method, i, CaseStatus.TIMEOUT, error=f"qnn_executor_runner did not finish within "
                               f"{options.case_timeout_s * len(cases):g} s", error_kind=FailureKind.HOST_TIMEOUT,
                               log_excerpt=excerpt, log_path=log) for i in cases]
        problem = executor_runner.classify(ex.output + "\n" + logcat, ex.exit_status)
        if problem:
            return [CaseResult(method, i, problem.status, error=problem.message, error_kind=problem.kind,
                               log_excerpt=problem.evidence or excerpt, log_path=log) for i in cases]
        produced = profiles.sort_qnn_outputs(self.transport.listdir(posixpath.join(run_dir, "outputs"), self.cfg.command_timeout_s))
        results = []
        for line_no, index in enumerate(cases):
            case = suite.test_cases[index]
            layout = [(v.scalar_type, list(v.sizes)) for v in case.expected_outputs if v.kind == "tensor"]
            names = produced.get(line_no, [])
            if len(names) < len(layout):
                results.append(CaseResult(method, index, CaseStatus.ERROR, error_kind=FailureKind.MISSING_OUTPUT,
                                          error=f"inference {line_no}: expected {len(layout)} output files, found {len(names)}",
                                          log_excerpt=excerpt, log_path=log, elapsed_s=per_case))
                continue
            local_dir = logs_dir / "outputs" / f"{_safe(method)}-{index}"
            local_dir.mkdir(parents=True, exist_ok=True)
            files = []
            for name in names[: len(layout)]:
                local = local_dir / name
                self._pull(posixpath.join(run_dir, "outputs", name), local, budget)
                files.append(local)
            outputs, err = raw_outputs_from_files(files, layout)
            if err:
                results.append(CaseResult(method, index, CaseStatus.ERROR, error=err, error_kind=FailureKind.WRONG_OUTPUT_SIZE,
                                          log_excerpt=excerpt, log_path=log, elapsed_s=per_case))
            else:
                results.append(CaseResult(method, index, CaseStatus.OK, outputs=outputs, log_excerpt=excerpt,
                                          log_path=log, elapsed_s=per_case))
        return results


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)
