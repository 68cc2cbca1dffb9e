"""The closed set of ways a case can fail to produce judgeable outputs.

Every target reports a `FailureKind` in `CaseResult.error_kind`; the report
keeps its value (docs/report-schema.md lists them with their meaning). Numerical
failures are not here: those are verdicts, decided on the host by runner/.
Reports written before this enum used free-text kinds; `FailureKind.parse`
maps those synonyms onto the closed set so old reports still read.
"""

from __future__ import annotations

import enum


class FailureKind(str, enum.Enum):
    """Why a case has no judgeable outputs. The value is what the report stores."""

    # The bundle or the request
    BAD_BUNDLE = "bad-bundle"  # the program or bundle cannot be loaded / is inconsistent
    UNSUPPORTED = "unsupported"  # this target cannot run this bundle or case (delegate, op, mode)
    # Setting up
    BAD_CONFIG = "bad-config"  # a target option or the project config is invalid
    TOOL_MISSING = "tool-missing"  # simulator, runner binary or device tool not found
    TOOL_FAILED = "tool-failed"  # the simulator/tool failed before the runner started
    HOST_IO = "host-io"  # the host could not write the run's files (a full disk, a folder removed)
    TRANSPORT = "transport"  # port/ADB/SSH link lost, device offline, push/pull cut
    AUTH_REFUSED = "auth-refused"  # the remote host refused our credentials (SSH key)
    HOST_KEY = "host-key"  # the remote host's key is unknown, changed or not the pinned one
    VERSION_MISMATCH = "version-mismatch"  # the remote bundlerun is a different version than this one
    DEVICE_FULL = "device-full"  # no space left on the device
    DEVICE_BUSY = "device-busy"  # the device (a labgrid place, every place of a pool) is reserved by someone else
    LOAD_FAILURE = "load-failure"  # the runtime could not load the program/method
    # Inside the runner
    ALLOCATION_FAILURE = "allocation-failure"  # a memory pool too small (bytes asked for in the cause)
    MISSING_OPERATOR = "missing-operator"  # a kernel the program needs is not in the runner
    MISSING_BACKEND = "missing-backend"  # a delegate the program needs is not registered in the runner
    RUNNER_ERROR = "runner-error"  # the runner logged an error (E) and stopped, or exited non-zero
    RUNNER_ABORT = "runner-abort"  # the runner aborted: F line, failed assertion, abort()
    HARD_FAULT = "hard-fault"  # a CPU fault (HardFault, BusFault, ...)
    CRASH = "crash"  # the runner process died on a signal (SIGSEGV, SIGKILL, ...)
    REBOOT = "reboot"  # the device restarted mid-run
    DEVICE_MISMATCH = "device-bundleio-mismatch"  # the runner's own BundleIO check failed and no outputs came back
    # Ending
    CPU_TIME_LIMIT = "cpu-time-limit"  # the simulator's CPU-time limit (FVP --timelimit) ended the run
    SIMULATED_TIME_LIMIT = "simulated-time-limit"  # an instruction/simulated-time budget ended the run (no lane sets one yet)
    HOST_TIMEOUT = "host-timeout"  # our wall-clock bound ended the run; process group killed
    INCOMPLETE = "incomplete"  # the run stopped before its end marker, for no reason the log shows
    NO_RUNNER_OUTPUT = "no-runner-output"  # bytes arrived, but no runner log line among them
    # Collecting
    MISSING_OUTPUT = "missing-output"  # an output file/tensor/line is absent
    WRONG_OUTPUT_SIZE = "wrong-output-size"  # an output has the wrong byte count / element count
    OUTPUT_COUNT = "output-count"  # the runner returned a different number of outputs
    # The run itself
    INTERRUPTED = "interrupted"  # the user stopped the run (Ctrl-C) before this case finished
    NOT_RUN = "not-run"  # an earlier failure made running this case pointless

    def __str__(self) -> str:  # the report value, also in f-strings and XML attributes
        return self.value

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]

    @property
    def is_timeout(self) -> bool:
        """Cases ending this way get the TIMEOUT verdict; all others ERROR."""
        return self in (FailureKind.HOST_TIMEOUT, FailureKind.CPU_TIME_LIMIT, FailureKind.SIMULATED_TIME_LIMIT)

    @classmethod
    def parse(cls, value: "str | FailureKind | None") -> "FailureKind | None":
        """A kind from live code: a member or its exact value; None stays None. Anything else
        (an old synonym, a typo) is a bug and raises ValueError, so it cannot hide in a report."""
        if value is None or isinstance(value, FailureKind):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a failure kind (targets/failures.py: "
                             f"{', '.join(k.value for k in cls)})") from None

    @classmethod
    def read(cls, value: "str | FailureKind | None") -> "FailureKind | None":
        """A kind from a report file: the current values, or the free-text kinds of reports written
        before the enum (mapped through their synonyms). Unknown text raises ValueError."""
        if isinstance(value, str) and value in _SYNONYMS:
            return _SYNONYMS[value]
        return cls.parse(value)


_MEANINGS: dict[FailureKind, str] = {
    FailureKind.BAD_BUNDLE: "the bundle or its program cannot be loaded, or is inconsistent",
    FailureKind.UNSUPPORTED: "this target cannot run this bundle or case",
    FailureKind.BAD_CONFIG: "a target option or the project configuration is invalid",
    FailureKind.TOOL_MISSING: "a simulator, runner binary or device tool was not found",
    FailureKind.TOOL_FAILED: "the simulator or tool failed before the runner started",
    FailureKind.HOST_IO: "the host could not write the run's files (a full disk, a folder that went away)",
    FailureKind.TRANSPORT: "the link to the device failed (port, ADB, SSH, push/pull)",
    FailureKind.AUTH_REFUSED: "the remote host refused the credentials (SSH key or agent)",
    FailureKind.HOST_KEY: "the remote host key is unknown, changed, or not the pinned fingerprint",
    FailureKind.VERSION_MISMATCH: "the remote bundlerun is a different version than the local one",
    FailureKind.DEVICE_FULL: "the device has no space left",
    FailureKind.DEVICE_BUSY: "the device (a labgrid place, or every place of a pool) is reserved by someone else",
    FailureKind.LOAD_FAILURE: "the runtime could not load the program or method",
    FailureKind.ALLOCATION_FAILURE: "a memory pool of the runner is too small for the model",
    FailureKind.MISSING_OPERATOR: "the runner lacks a kernel the program needs",
    FailureKind.MISSING_BACKEND: "the runner lacks a delegate backend the program needs",
    FailureKind.RUNNER_ERROR: "the runner logged an error and stopped, or exited non-zero",
    FailureKind.RUNNER_ABORT: "the runner aborted (fatal log line, failed assertion, abort)",
    FailureKind.HARD_FAULT: "the CPU faulted (HardFault, BusFault, UsageFault, MemManage)",
    FailureKind.CRASH: "the runner process died on a signal",
    FailureKind.REBOOT: "the device restarted during the run",
    FailureKind.DEVICE_MISMATCH: "the runner's own BundleIO check failed and no outputs came back",
    FailureKind.CPU_TIME_LIMIT: "the simulator's CPU-time limit ended the run",
    FailureKind.SIMULATED_TIME_LIMIT: "the instruction or simulated-time budget ended the run",
    FailureKind.HOST_TIMEOUT: "the host's wall-clock bound ended the run; its processes were killed",
    FailureKind.INCOMPLETE: "the run stopped before its end marker with no cause in the log",
    FailureKind.NO_RUNNER_OUTPUT: "output arrived but held no runner log line",
    FailureKind.MISSING_OUTPUT: "an output tensor, file or printed line is absent",
    FailureKind.WRONG_OUTPUT_SIZE: "an output has the wrong size",
    FailureKind.OUTPUT_COUNT: "the runner returned a different number of outputs than the bundle expects",
    FailureKind.INTERRUPTED: "the user interrupted the run before this case finished",
    FailureKind.NOT_RUN: "not run because an earlier failure made it pointless",
}

# Free-text kinds of reports written before the enum.
_SYNONYMS: dict[str, FailureKind] = {
    "timeout": FailureKind.HOST_TIMEOUT, "hang": FailureKind.HOST_TIMEOUT, "load-timeout": FailureKind.HOST_TIMEOUT,
    "flash-timeout": FailureKind.HOST_TIMEOUT, "cpu-time-exceeded": FailureKind.CPU_TIME_LIMIT,
    "output-size": FailureKind.WRONG_OUTPUT_SIZE, "wrong-size-output": FailureKind.WRONG_OUTPUT_SIZE,
    "missing-file": FailureKind.MISSING_OUTPUT, "runner-fatal": FailureKind.RUNNER_ABORT,
    "fvp-failed": FailureKind.TOOL_FAILED, "target": FailureKind.TOOL_MISSING, "load": FailureKind.LOAD_FAILURE,
    "runtime": FailureKind.RUNNER_ERROR, "kernel-error": FailureKind.RUNNER_ERROR,
    "backend-error": FailureKind.RUNNER_ERROR, "unsupported-op": FailureKind.MISSING_OPERATOR,
    "unsupported-backend": FailureKind.MISSING_BACKEND, "bad-program": FailureKind.BAD_BUNDLE,
    "bad-input": FailureKind.BAD_BUNDLE, "needs-flash": FailureKind.UNSUPPORTED, "gave-up": FailureKind.NOT_RUN,
    "port-lost": FailureKind.TRANSPORT, "port-busy": FailureKind.TRANSPORT, "port-missing": FailureKind.TRANSPORT,
    "port-open": FailureKind.TRANSPORT, "reset": FailureKind.TRANSPORT, "flash": FailureKind.TOOL_FAILED,
    "no-output": FailureKind.HOST_TIMEOUT, "missing-library": FailureKind.LOAD_FAILURE,
    "runner-flags": FailureKind.TOOL_FAILED, "runner-missing": FailureKind.TOOL_MISSING,
    "no-space": FailureKind.DEVICE_FULL, "offline": FailureKind.TRANSPORT, "unauthorized": FailureKind.TRANSPORT,
    "absent": FailureKind.TRANSPORT, "usb": FailureKind.TRANSPORT, "device-command": FailureKind.TRANSPORT,
}
