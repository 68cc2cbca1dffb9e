#!/usr/bin/env python3
"""Test double for the Arm Corstone FVPs running ExecuTorch's arm_executor_runner.

Installed by the tests under the real binary names (FVP_Corstone_SSE-300_Ethos-U55,
FVP_Corstone_SSE-300_Ethos-U65, FVP_Corstone_SSE-320); the platform comes from
argv[0]. It honours the real command-line contract: every `-C` key is checked
against the parameter names the real platform has (an unknown one is an error
exit, as on the real FVP), `-a`, `--timelimit`, `--data FILE@ADDR`, `--version`.

With `<cpu>.semihosting-enable=1` it emulates a semihosting BundleIO runner: it
reads `semihosting-cwd` and `semihosting-cmd_line`, runs test case 0 of the
bundle through the host ExecuTorch runtime (pybindings), writes `out-<i>.bin`
and prints the runner's log lines. Without semihosting it emulates a UART
runner with the bundle linked into the "ELF" (found by its BP08 identifier) or
placed with `--data`, printing `Output[i][j]` lines and ending with EOT.

BUNDLERUN_FVP_SCENARIO selects a behaviour: pass (default), numerical,
verdict-fail, hard-fault, cpu-time, hang, garbage, missing-outputs, wrong-size,
reboot, linger. BUNDLERUN_FVP_PIDFILE, when set, receives the PID of every
process the double starts (so tests can prove they are gone).
BUNDLERUN_FVP_ARGSFILE, when set, receives the argv as JSON lines.

Performance lines: after the inference it prints what the real runner's
StopMeasurements() prints for an Ethos-U build (arm_perf_monitor.cpp: CPU cycles,
Ethos-U cycle count, NPU/CPU ratios, the PMU counters: 4 named for U55/U65, 7 for
U85), and after "Model run" the log_mem_status() lines (arm_executor_runner.cpp),
with the runner's own format strings. The numbers are synthetic and deterministic:
every cycle count is a fixed multiple of the program's size in bytes (the
program inside the bundle), the memory figures are derived from it too; the
double cannot see a memory plan or a command stream. Double-only knobs:
BUNDLERUN_FVP_CYCLE_SCALE=F (a positive float, default 1) multiplies every
cycle figure (CPU cycles, NPU cycles, cycle-type PMU counters such as NPU_IDLE;
beat counters and memory stay), so a test can fake a cycle regression;
BUNDLERUN_FVP_ETHOSU=0 emulates a runner built without Ethos-U (a Cortex-M only
build): StopMeasurements() prints nothing.

Test-only: never on a user's code path.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

BOARD_300 = {
    "num_macs_key": "ethosu.num_macs",
    "cpu": "cpu0",
    "params": {
        "ethosu.num_macs",
        "ethosu.extra_args",
        "mps3_board.visualisation.disable-visualisation",
        "mps3_board.uart0.out_file",
        "mps3_board.uart0.shutdown_on_eot",
        "mps3_board.uart0.unbuffered_output",
        "mps3_board.uart1.out_file",
        "mps3_board.uart1.shutdown_on_eot",
        "mps3_board.telnetterminal0.start_telnet",
        "mps3_board.telnetterminal1.start_telnet",
        "mps3_board.telnetterminal2.start_telnet",
        "mps3_board.telnetterminal5.start_telnet",
        "mps3_board.telnetterminal0.quiet",
        "mps3_board.DISABLE_GATING",
        "cpu0.semihosting-enable",
        "cpu0.semihosting-stack_base",
        "cpu0.semihosting-stack_limit",
        "cpu0.semihosting-heap_base",
        "cpu0.semihosting-heap_limit",
        "cpu0.semihosting-cwd",
        "cpu0.semihosting-cmd_line",
        "cpu0.CFGDTCMSZ",
        "cpu0.CFGITCMSZ",
        "cpu0.FPU",
        "cpu0.MVE",
    },
}
BOARD_320 = {
    "num_macs_key": "mps4_board.subsystem.ethosu.num_macs",
    "cpu": "mps4_board.subsystem.cpu0",
    "params": {
        "mps4_board.subsystem.ethosu.num_macs",
        "mps4_board.subsystem.ethosu.extra_args",
        "mps4_board.visualisation.disable-visualisation",
        "vis_hdlcd.disable_visualisation",
        "mps4_board.uart0.out_file",
        "mps4_board.uart0.shutdown_on_eot",
        "mps4_board.uart0.unbuffered_output",
        "mps4_board.uart1.out_file",
        "mps4_board.telnetterminal0.start_telnet",
        "mps4_board.telnetterminal1.start_telnet",
        "mps4_board.telnetterminal2.start_telnet",
        "mps4_board.telnetterminal5.start_telnet",
        "mps4_board.subsystem.cpu0.semihosting-enable",
        "mps4_board.subsystem.cpu0.semihosting-stack_base",
        "mps4_board.subsystem.cpu0.semihosting-stack_limit",
        "mps4_board.subsystem.cpu0.semihosting-heap_base",
        "mps4_board.subsystem.cpu0.semihosting-heap_limit",
        "mps4_board.subsystem.cpu0.semihosting-cwd",
        "mps4_board.subsystem.cpu0.semihosting-cmd_line",
    },
}
PLATFORMS = {
    "FVP_Corstone_SSE-300_Ethos-U55": (BOARD_300, "Ethos-U55", (32, 64, 128, 256)),
    "FVP_Corstone_SSE-300_Ethos-U65": (BOARD_300, "Ethos-U65", (256, 512)),
    "FVP_Corstone_SSE-320": (BOARD_320, "Ethos-U85", (128, 256, 512, 1024, 2048)),
}
VERSION_TEXT = "Fast Models [11.27.31 (Oct 14 2024)]\nCopyright 2000-2024 ARM Limited.\nAll Rights Reserved.\n"
ERROR_NOT_FOUND = 0x20  # executorch Error::NotFound, what verify_method_outputs returns on mismatch

# Line numbers of the runner's ET_LOG calls (arm_executor_runner.cpp, 2026 layout).
_LN = {
    "params": 1271, "param": 1289, "read_input": 1302, "read_pte": 1320, "pte_at": 1356,
    "loaded": 551, "methods": 563, "running_method": 570, "alloc": 581, "method_loaded": 796,
    "preparing": 798, "testset": 805, "prepared": 868, "start": 1130, "finished": 1153,
    "n_outputs": 889, "writing": 933, "stats": 1092, "match": 1106, "mismatch": 1110,
    "result_fail": 1115, "status": 1117, "model_run": 1156, "main_model_run": 1362,
    "complete": 1369, "eot": 1373, "fatal": 1366, "etdump_size": 1005,
    "etdump_setup": 807, "etdump_buffer": 827, "etdump_write_debug": 1231, "etdump_write": 1253,
    # runner_init / log_mem_status, numbered as in the extracted sources (examples/arm/executor_runner)
    "planned_buffer": 740, "mem_program_addr": 958, "mem_loaded_addr": 962, "mem_program": 967,
    "mem_loaded": 971, "mem_input_file": 979, "mem_method": 992, "mem_planned": 1000,
    "mem_method_loaded": 1021, "mem_method_input": 1025, "mem_method_executor": 1029, "mem_temp": 1035,
}
# StopMeasurements() in arm_perf_monitor.cpp: line of each ET_LOG
_PERF_LN = {
    "inferences": 150, "delegations": 151, "profiler": 156, "backend": 160, "operators": 168, "runtime": 175,
    "note": 181, "cpu_ratio": 190, "npu_ratio": 194, "wait": 203, "pmu_report": 209, "pmu_cycles": 210,
    "pmu_cntr": 217, "events_u55": 225, "events_u85": 229,
}
# The PMU events the runner programs (ethosu_inference_begin), as its "Ethos-U PMU Events:" line names them
_PMU_EVENTS = {
    "u55": ("ETHOSU_PMU_AXI0_RD_DATA_BEAT_RECEIVED", "ETHOSU_PMU_AXI1_RD_DATA_BEAT_RECEIVED",
            "ETHOSU_PMU_AXI0_WR_DATA_BEAT_WRITTEN", "ETHOSU_PMU_NPU_IDLE"),
    "u85": ("ETHOSU_PMU_SRAM_RD_DATA_BEAT_RECEIVED", "ETHOSU_PMU_SRAM_WR_DATA_BEAT_WRITTEN",
            "ETHOSU_PMU_EXT_RD_DATA_BEAT_RECEIVED", "ETHOSU_PMU_EXT_WR_DATA_BEAT_WRITTEN", "ETHOSU_PMU_NPU_IDLE",
            "ETHOSU_PMU_MAC_ACTIVE", "ETHOSU_PMU_WD_ACTIVE"),
}
# Per program byte: (events, scaled by BUNDLERUN_FVP_CYCLE_SCALE?) for each counter above
_PMU_PER_BYTE = {
    "u55": ((1 / 4, False), (1 / 16, False), (1 / 32, False), (2, True)),
    "u85": ((1 / 8, False), (1 / 32, False), (1 / 4, False), (1 / 64, False), (2, True), (16, True), (6, True)),
}
METHOD_POOL = 62914560  # ET_ARM_BAREMETAL_METHOD_ALLOCATOR_POOL_SIZE default (60 MiB)
FILE_POOL = 62914560  # ET_ARM_BAREMETAL_SEMIHOSTING_FILE_ALLOCATOR_POOL_SIZE default (60 MiB)
TEMP_POOL = 0x200000  # ET_ARM_BAREMETAL_SCRATCH_TEMP_ALLOCATOR_POOL_SIZE, Shared_Sram default


class Fvp:
    def __init__(self, name: str):
        self.name = name
        self.board, self.npu, self.macs = PLATFORMS[name]
        self.params: dict[str, str] = {}
        self.app: str | None = None
        self.timelimit: float | None = None
        self.data: list[str] = []
        self.scenario = os.environ.get("BUNDLERUN_FVP_SCENARIO", "pass")
        self.runner_stream = sys.stdout
        self.t0 = time.monotonic()
        self.ns = 0
        try:
            self.cycle_scale = float(os.environ.get("BUNDLERUN_FVP_CYCLE_SCALE", "1"))
        except ValueError:
            self.cycle_scale = -1.0
        if not 0 < self.cycle_scale < float("inf"):
            self.fail(f"fvp_double: BUNDLERUN_FVP_CYCLE_SCALE must be a positive number, got "
                      f"{os.environ.get('BUNDLERUN_FVP_CYCLE_SCALE')!r}", 2)
        self.ethosu = os.environ.get("BUNDLERUN_FVP_ETHOSU", "1") != "0"

    # -- command line -------------------------------------------------------------

    def fail(self, msg: str, code: int = 1) -> "NoReturn":  # noqa: F821
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
        sys.exit(code)

    def parse(self, argv: list[str]) -> None:
        i = 0
        while i < len(argv):
            a = argv[i]

            def value() -> str:
                nonlocal i
                if i + 1 >= len(argv):
                    self.fail(f"ERROR: option '{a}' requires an argument")
                i += 1
                return argv[i]

            if a == "--version":
                sys.stdout.write(VERSION_TEXT)
                sys.exit(0)
            elif a in ("-C", "--parameter"):
                self.set_param(value())
            elif a.startswith("-C") and len(a) > 2:
                self.set_param(a[2:])
            elif a in ("-a", "--application"):
                v = value()
                self.app = v.split("=", 1)[1] if "=" in v and not Path(v).exists() else v
            elif a == "--timelimit":
                v = value()
                try:
                    self.timelimit = float(v)
                except ValueError:
                    self.fail(f"ERROR: invalid --timelimit value '{v}'")
            elif a == "--data":
                spec = value()
                path, sep, addr = spec.split("=", 1)[-1].rpartition("@")
                if not sep or not re.fullmatch(r"0x[0-9a-fA-F]+|\d+", addr):
                    self.fail(f"ERROR: --data expects [INST=]FILE@ADDRESS, got '{spec}'")
                if not Path(path).is_file():
                    self.fail(f"ERROR: Could not open data file '{path}'")
                self.data.append(spec)
            elif a in ("-q", "--quiet", "--stat"):
                pass
            elif a == "--cyclelimit":
                value()
            else:
                self.fail(f"ERROR: unrecognised option '{a}'\nUse --help for a list of options.")
            i += 1
        if self.app is None:
            self.fail("ERROR: no application given (-a)")
        if not Path(self.app).is_file():
            self.fail(f"ERROR: Could not load application file '{self.app}'")

    def set_param(self, text: str) -> None:
        if "=" not in text:
            self.fail(f"ERROR: parameter '{text}' has no value (expected NAME=VALUE)")
        key, val = text.split("=", 1)
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
            val = val[1:-1]  # the FVP strips one level of quotes
        if key not in self.board["params"]:
            self.fail(f"ERROR: Unknown parameter '{key}' for model {self.name}")
        if key == self.board["num_macs_key"]:
            if not val.isdigit() or int(val) not in self.macs:
                self.fail(f"ERROR: Parameter '{key}': value {val} out of range (valid: {self.macs})")
        self.params[key] = val

    def p(self, suffix: str, default: str | None = None) -> str | None:
        return self.params.get(f"{self.board['cpu']}.{suffix}", default)

    def board_p(self, name: str, default: str | None = None) -> str | None:
        prefix = "mps3_board" if self.board is BOARD_300 else "mps4_board"
        return self.params.get(f"{prefix}.{name}", default)

    # -- output helpers -------------------------------------------------------------

    def out(self, text: str, stream=None) -> None:
        (stream or sys.stdout).write(text + "\n")
        (stream or sys.stdout).flush()

    def log(self, level: str, key: str, msg: str, func: str = "main") -> None:
        self.out(f"{level} [executorch:arm_executor_runner.cpp:{_LN.get(key, 100)} {func}()] {msg}", self.runner_stream)

    def perf_log(self, key: str, msg: str) -> None:
        self.out(f"I [executorch:arm_perf_monitor.cpp:{_PERF_LN[key]} StopMeasurements()] {msg}", self.runner_stream)

    def banner(self) -> None:
        for n, port in ((0, 5000), (1, 5001), (2, 5002), (5, 5003)):
            self.out(f"telnetterminal{n}: Listening for serial connection on port {port}")
        self.out("")
        self.out("    Ethos-U rev 136b7d75 --- Apr 12 2023 13:44:01")
        self.out("    (C) COPYRIGHT 2019-2023 Arm Limited")
        self.out("    ALL RIGHTS RESERVED")
        self.out("")

    def stop(self, reason: str | None = None) -> "NoReturn":  # noqa: F821
        if reason:
            self.out(f"\nInfo: Simulation is stopping. Reason: {reason}\n")
        self.out("Info: /OSCI/SystemC: Simulation stopped by user.")
        self.out(f"[warning ][main@0][{int((time.monotonic() - self.t0) * 1e9)} ns] Simulation stopped by user")
        sys.exit(0)

    def run_out_timelimit(self) -> "NoReturn":  # noqa: F821
        limit = self.timelimit if self.timelimit is not None else 3600.0
        remaining = limit - (time.monotonic() - self.t0)
        if remaining > 0:
            time.sleep(remaining)
        self.stop("CPU time has been exceeded.")

    # -- the emulated runner ----------------------------------------------------------

    def main(self) -> None:
        self.banner()
        semihosting = self.p("semihosting-enable", "0") in ("1", "true")
        if self.scenario == "garbage":
            rng = random.Random(7)
            sys.stdout.buffer.write(bytes(rng.randrange(256) for _ in range(600)).replace(b"\n", b"\xff"))
            sys.stdout.buffer.write(b"\r\x00\x80partial")
            sys.stdout.flush()
            sys.exit(0)
        if semihosting:
            self.semihosting_main()
        else:
            self.uart_main()

    def semihosting_main(self) -> None:
        self.runner_stream = sys.stderr  # semihosting stdio goes to the host's stderr
        cwd = Path(self.p("semihosting-cwd") or os.getcwd())
        cmd_line = self.p("semihosting-cmd_line") or ""
        argv = shlex.split(cmd_line[:255])  # the FVP truncates past 256 characters
        self.log("I", "params", "Running executor with parameter:")
        if len(argv) < 7:
            self.log("F", "params", "Not right number of parameters!")
            self.log("F", "params", "app -m model.pte -i input.bin [-i input2.bin] -o output_basename")
            self.log("F", "params", "Exiting!")
            self.stop()
        self.log("I", "param", f"   {argv[0]}")
        for k in range(1, len(argv) - 1, 2):
            self.log("I", "param", f"   {argv[k]} {argv[k + 1]}")
        model = out_base = None
        k = 0
        n_inputs = 0
        file_sizes: list[int] = []  # what the runner read into its input file allocator, in order
        while k < len(argv):
            if argv[k] == "-i" and k + 1 < len(argv):
                n_inputs += 1
                name = argv[k + 1]
                self.log("I", "read_input", f"Reading input tensor {n_inputs} from file {name}")
                if not (cwd / name).is_file():
                    self.log("F", "read_input", f"Could not open file {name} (errno: 2) for reading, exiting!", "read_binary_file")
                    self.log("E", "read_input", f"Reading input tensor {n_inputs} from file {name} failed.")
                    self.stop()
                file_sizes.append((cwd / name).stat().st_size)
                k += 2
            elif argv[k] == "-m" and k + 1 < len(argv):
                name = argv[k + 1]
                self.log("I", "read_pte", f"Reading pte model from file {name}")
                if not (cwd / name).is_file():
                    self.log("F", "read_pte", f"Could not open file {name} (errno: 2) for reading, exiting!", "read_binary_file")
                    self.log("E", "read_pte", f"Reading pte model from file {name} failed.")
                    self.stop()
                model = (cwd / name).read_bytes()
                file_sizes.append(len(model))
                k += 2
            elif argv[k] == "-o" and k + 1 < len(argv):
                out_base = argv[k + 1]
                k += 2
            else:
                k += 1
        if model is None:
            self.log("F", "pte_at", "Model data is not initialized")
            self.stop()
        if out_base is None:
            self.log("F", "pte_at", "Missing required -o output_basename")
            self.stop()
        self.execute(model, cwd=cwd, out_base=out_base, file_sizes=file_sizes)

    def uart_stream(self):
        """Where UART0 goes: stdout for out_file=-, a file, or (no out_file) the
        telnet terminal nobody is connected to."""
        target = self.board_p("uart0.out_file")
        if target == "-":
            return sys.stdout
        if target:
            return open(target, "a", buffering=1)
        import io

        return io.StringIO()

    def uart_main(self) -> None:
        self.runner_stream = self.uart_stream()
        model = None
        at_addr = False  # ET_MODEL_PTE_ADDR build: the bundle is placed with --data, not baked in
        for spec in self.data:
            path = spec.split("=", 1)[-1].rsplit("@", 1)[0]
            if Path(path).is_file():
                model = Path(path).read_bytes()
                at_addr = True
        if model is None:
            blob = Path(self.app).read_bytes()
            at = blob.find(b"BP08")
            if at >= 4:
                model = blob[at - 4 :]
        if model is None:
            self.log("I", "pte_at", "PTE @ 0x70000000 [----\xff\xff\xff\xff]")
            self.log("F", "loaded", "In function runner_init(), assert failed (program_result.ok()): Program loading failed @ 0x70000000: 0x23", "runner_init")
            self.run_out_timelimit()
        self.execute(model, cwd=None, out_base=None, pte_at_addr=at_addr)

    def execute(self, model: bytes, cwd: Path | None, out_base: str | None,
                file_sizes: list[int] | None = None, pte_at_addr: bool = False) -> None:
        sc = self.scenario
        program_len = _program_len(model)
        self.log("I", "pte_at", f"PTE @ 0x70000000 [----{model[4:8].decode('ascii', 'replace')}]")
        if sc == "reboot":  # a watchdog reset: the runner starts over without a fault line
            self.log("I", "params", "Running executor with parameter:")
            self.log("I", "pte_at", f"PTE @ 0x70000000 [----{model[4:8].decode('ascii', 'replace')}]")
        self.log("I", "loaded", f"PTE Model data loaded. Size: {program_len} bytes.", "runner_init")
        self.log("I", "methods", "Model buffer loaded, has 1 methods", "runner_init")
        method = _first_method(model)
        self.log("I", "running_method", f"Running method {method}", "runner_init")
        self.log("I", "alloc", f"Setup Method allocator pool. Size: {METHOD_POOL} bytes.", "runner_init")
        planned, loaded = _memory_model(program_len)
        self.log("I", "planned_buffer", f"Setting up planned buffer with mem_id=1, size {planned}.", "runner_init")
        self.log("I", "method_loaded", f"Method '{method}' loaded.", "runner_init")
        self.log("I", "preparing", "Preparing inputs...", "runner_init")
        self.log("I", "testset", "Input testset[0] from bundled bpte", "runner_init")
        self.log("I", "prepared", "Input prepared.", "runner_init")
        self.log("I", "start", "Starting running 1 inferences...", "run_model")
        if sc == "hard-fault":
            self.out("Hard fault. irq=-13, pc=0x10003a4c, lr=0x1000219f, xpsr=0x61000000, sp=0x3007ff38")
            self.run_out_timelimit()
        if sc == "cpu-time":
            self.run_out_timelimit()
        if sc == "hang":
            self.hang()

        try:
            outputs, expected, status = run_case0(model, method)
        except Exception as exc:  # e.g. an Ethos-U command stream: the host runtime has no EthosUBackend
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.log("E", "method_loaded", f"Host runtime of the FVP double cannot run this program: {first}", "runner_init")
            self.log("F", "start", f"In function run_model(), assert failed (status == Error::Ok): Execution of method {method} failed with status 0x1", "run_model")
            self.stop()
        if self.ethosu:
            self.stop_measurements(program_len)
        if sc == "numerical":
            outputs = [_perturb(o) for o in outputs]
            status = None  # verdict recomputed on what the "device" produced
        self.log("I", "finished", "1 inferences finished", "run_model")
        self.log("I", "n_outputs", f"{len(outputs)} outputs: ", "print_outputs")
        for i, arr in enumerate(outputs):
            if out_base is None:
                if os.environ.get("BUNDLERUN_FVP_LOG_OUTPUT", "1") != "0":
                    _print_output_lines(i, arr, self.runner_stream)
                continue
            name = f"{out_base}-{i}.bin"
            if sc == "missing-outputs":
                continue  # an old runner that silently wrote nothing
            self.log("I", "writing", f"Writing output to file: {name}", "print_outputs")
            data = arr.tobytes()
            if sc == "wrong-size":
                data = data[: len(data) // 2]
            (cwd / name).write_bytes(data)

        et_rtol = float(os.environ.get("BUNDLERUN_FVP_ET_RTOL", "0.01"))
        et_atol = float(os.environ.get("BUNDLERUN_FVP_ET_ATOL", "0.01"))
        stats = _error_stats(outputs, expected)
        self.log("I", "stats", "=== Error stats for testset 0 ===", "verify_result")
        self.log("I", "stats", f" mean_absolute_error: {stats[0]:f}", "verify_result")
        self.log("I", "stats", f" max_absolute_error:  {stats[1]:f}", "verify_result")
        self.log("I", "stats", f" mean_relative_error: {stats[2]:f}", "verify_result")
        self.log("I", "stats", f" max_relative_error:  {stats[3]:f}", "verify_result")
        if status is None:
            ok = _cpp_verify(outputs, expected, et_rtol, et_atol)
        else:
            ok = status == 0
        if sc == "verdict-fail":
            ok, et_rtol, et_atol = False, 0.0, 0.0
        if ok:
            self.log("I", "match", "Model output match expected BundleIO bpte ref data.", "verify_result")
            self.log("I", "match", "TEST: BundleIO index[0] Test_result: PASS", "verify_result")
        else:
            self.log("E", "mismatch", f"Model output don't match expected BundleIO bpte ref data. rtol={et_rtol:f} atol={et_atol:f}", "verify_result")
            self.log("E", "result_fail", "TEST: BundleIO index[0] Test_result: FAIL", "verify_result")
            self.log("E", "status", f"Bundle verification failed with status 0x{ERROR_NOT_FOUND:x}", "verify_result")
        self.log("I", "model_run", f"Model run: {int(ok)}", "run_model")
        self.log("I", "main_model_run", f"Model run: {int(ok)}")
        self.log_mem_status(model, program_len, file_sizes if cwd is not None else None, pte_at_addr)
        if cwd is None and os.environ.get("BUNDLERUN_FVP_ETDUMP") == "1":
            self.print_etdump(model, method)
        if cwd is not None and os.environ.get("BUNDLERUN_FVP_ETDUMP") == "1":
            self.write_etdump_files(model, method, cwd)
        if not ok:
            self.log("F", "fatal", "In function main(), assert failed (model_ok == true): Problem running model")
            if cwd is not None:
                self.stop()  # et_pal_abort -> _exit(-1) under semihosting
            self.run_out_timelimit()  # et_pal_abort -> __builtin_trap(): the CPU stops, the FVP runs on
        self.log("I", "complete", "Program complete, exiting.")
        if cwd is not None:
            self.stop()  # semihosting _exit(0)
        self.log("I", "eot", "\x04")
        if sc == "linger" or self.board_p("uart0.shutdown_on_eot", "0") not in ("1", "true"):
            self.hang(spawn=False)
        self.stop()

    def stop_measurements(self, program_len: int, n: int = 1) -> None:
        """StopMeasurements(n) of an Ethos-U build, its format strings verbatim (arm_perf_monitor.cpp).
        `% lu` there prints no space for an unsigned value (newlib, like glibc, ignores the flag)."""
        s = self.cycle_scale

        def cycles(per_byte: float) -> int:
            return round(per_byte * program_len * s)

        npu, wait, backend, total = cycles(24), cycles(26), cycles(28), cycles(32)
        delegations = n
        variant = "u85" if self.npu == "Ethos-U85" else "u55"  # U65 is programmed like U55
        counters = [round(per * program_len * (s if scaled else 1)) for per, scaled in _PMU_PER_BYTE[variant]]
        p = self.perf_log
        p("inferences", f"NPU Inferences : {n}")
        p("delegations", f"NPU delegations: {delegations} ({delegations / n:.2f} per inference)")
        p("profiler", "Profiler report, CPU cycles per operator:")
        p("backend", f"ethos-u : cycle_cnt : {backend} cycles ({backend / n:.2f} per inference)")
        p("operators", f"Operator(s) total: {backend} CPU cycles ({backend / n:.2f} per inference)")
        p("runtime", f"Inference runtime: {total} CPU cycles total ({total / n:.2f} per inference)")
        p("note", "NOTE: CPU cycle values and ratio calculations require FPGA and identical CPU/NPU frequency")
        p("cpu_ratio", f"Inference CPU ratio: {100.0 * (total - wait) / total:.2f} %")
        p("npu_ratio", f"Inference NPU ratio: {100.0 * wait / total:.2f} %")
        p("wait", f"cpu_wait_for_npu_cntr : {wait} CPU cycles ({wait / n:.2f} per inference)")
        p("pmu_report", "Ethos-U PMU report:")
        p("pmu_cycles", f"ethosu_pmu_cycle_cntr : {npu} ({npu / n:.2f} per inference)")
        for i, v in enumerate(counters):
            p("pmu_cntr", f"ethosu_pmu_cntr{i} : {v} ({v / n:.2f} per inference)")
        p(f"events_{variant}", f"Ethos-U PMU Events:[{', '.join(_PMU_EVENTS[variant])}]")

    def log_mem_status(self, model: bytes, program_len: int, file_sizes: list[int] | None, pte_at_addr: bool) -> None:
        """log_mem_status() (arm_executor_runner.cpp): a semihosting build also reports its input
        file allocator; a runner whose bundle sits at ET_MODEL_PTE_ADDR says the size is unknown."""
        func = "log_mem_status"
        if pte_at_addr:
            unknown = " (pte size unknown when not baked into elf)"
            self.log("I", "mem_program_addr", f"model_pte_program_size:     {program_len} bytes.{unknown}", func)
            self.log("I", "mem_loaded_addr", f"model_pte_loaded_size:      {len(model)} bytes.{unknown}", func)
        else:
            self.log("I", "mem_program", f"model_pte_program_size:     {program_len} bytes.", func)
            self.log("I", "mem_loaded", f"model_pte_loaded_size:      {len(model)} bytes.", func)
        if file_sizes is not None:
            used = 0
            for size in file_sizes:  # 16-byte aligned allocations, one per file read
                used = _align(used, 16) + size
            self.log("I", "mem_input_file", f"input_file_allocator_used: {used} / {FILE_POOL} free: {FILE_POOL - used} "
                     f"( used: {100 * used // FILE_POOL} % ) ", func)
        planned, loaded = _memory_model(program_len)
        used = planned + loaded
        self.log("I", "mem_method", f"method_allocator_used:     {used} / {METHOD_POOL}  free: {METHOD_POOL - used} "
                 f"( used: {100 * used // METHOD_POOL} % ) ", func)
        self.log("I", "mem_planned", f"method_allocator_planned:  {planned} bytes", func)
        self.log("I", "mem_method_loaded", f"method_allocator_loaded:   {loaded} bytes", func)
        self.log("I", "mem_method_input", "method_allocator_input:    0 bytes", func)
        self.log("I", "mem_method_executor", "method_allocator_executor: 0 bytes", func)
        self.log("I", "mem_temp", f"temp_allocator:            {TEMP_POOL}", func)

    def write_etdump_files(self, model: bytes, method: str, cwd: Path) -> None:
        """A semihosting --etdump runner's write_etdump(): debug_buffer.bin and etdump.bin in the
        cwd (here: ExecuTorch's pybindings with ETDump + a debug buffer, every intermediate)."""
        etdump, debug = run_case0_etdump(model, method)
        self.log("I", "etdump_setup", "Setting up ETDump", "runner_init")
        self.log("I", "etdump_buffer", f"ETDump: Allocated intermediate output buffer size: {1 << 20} at 0x70100000",
                 "runner_init")
        self.log("I", "etdump_write_debug", "Writing etdump debug_buffer to file: debug_buffer.bin", "write_etdump")
        (cwd / "debug_buffer.bin").write_bytes(debug)
        self.log("I", "etdump_write", "Writing etdump to file: etdump.bin", "write_etdump")
        (cwd / "etdump.bin").write_bytes(etdump)

    def print_etdump(self, model: bytes, method: str) -> None:
        etdump, debug = run_case0_etdump(model, method)
        uart = lambda text: self.out(text, self.runner_stream)  # noqa: E731
        self.log("I", "etdump_size", f"[base64] buffer size: {len(base64.b64encode(etdump))}", "write_etdump")
        uart("#[RUN THIS]")
        if debug:
            uart("# Writing debug_buffer.bin [base64]")
            uart(f'echo "{base64.b64encode(debug).decode()}" | base64 -d >debug_buffer.bin')
        uart("# Writing etdump.bin [base64]")
        uart(f'echo "{base64.b64encode(etdump).decode()}" | base64 -d >etdump.bin')
        uart("# Generate cpu cycle table with:")
        flag = "--debug_buffer_path debug_buffer.bin" if debug else ""
        uart(f"python3 -m devtools.inspector.inspector_cli --etdump_path etdump.bin {flag} --source_time_scale cycles --target_time_scale cycles")
        uart("#[END]")

    def hang(self, spawn: bool = True) -> "NoReturn":  # noqa: F821
        """A wedged simulator: ignores SIGTERM, ignores --timelimit, and has a child."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if spawn:
            child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
            _record_pid(child.pid)
        while True:
            time.sleep(1)


def _record_pid(pid: int) -> None:
    path = os.environ.get("BUNDLERUN_FVP_PIDFILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def _first_method(model: bytes) -> str:
    from bundlerun.bundles.bpte import parse_bundle

    try:
        return parse_bundle(model, in_memory=True).method_test_suites[0].method_name
    except Exception:
        return "forward"


def _program_len(model: bytes) -> int:
    """Size of the program inside the bundle (what the runner's loader gets), else of the blob."""
    from bundlerun.bundles.bpte import parse_bundle

    try:
        return len(parse_bundle(model, in_memory=True).program)
    except Exception:
        return len(model)


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _memory_model(program_len: int) -> tuple[int, int]:
    """(planned buffer, method_allocator_loaded) bytes: synthetic, a fixed function of the program
    size (the double cannot see the memory plan)."""
    return _align(program_len // 4, 16), 1024 + _align(program_len // 16, 8)


def _expected(model: bytes):
    from bundlerun.bundles.bpte import parse_bundle

    case = parse_bundle(model, in_memory=True).method_test_suites[0].test_cases[0]
    return [v.to_array() for v in case.expected_outputs if v.kind == "tensor"]


def _to_numpy(t):
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy() if hasattr(torch, "uint16") else t.view(torch.int16).numpy().view("uint16")
    return t.numpy()


def _runtime():
    """The ExecuTorch pybindings. `_C` is the same C++ runtime portable_lib wraps;
    importing it directly skips portable_lib's import of all of exir (~8 s)."""
    import torch  # noqa: F401  (the extension needs torch's libraries loaded)

    try:
        from executorch.extension.pybindings import _C as pl
    except ImportError:
        from executorch.extension.pybindings import portable_lib as pl
    return pl


def run_case0(model: bytes, method: str):
    """Case 0 through the host ExecuTorch runtime: (outputs, expected, verify status)."""
    pl = _runtime()

    bundled = pl._load_bundled_program_from_buffer(model)
    outs = bundled.verify_result_with_bundled_expected_output(method, 0, 1e30, 1e30)
    outputs = [_to_numpy(o) for o in outs]
    et_rtol = float(os.environ.get("BUNDLERUN_FVP_ET_RTOL", "0.01"))
    et_atol = float(os.environ.get("BUNDLERUN_FVP_ET_ATOL", "0.01"))
    try:
        bundled.verify_result_with_bundled_expected_output(method, 0, et_rtol, et_atol)
        status = 0
    except RuntimeError:
        status = ERROR_NOT_FOUND
    return outputs, _expected(model), status


def run_case0_etdump(model: bytes, method: str) -> tuple[bytes, bytes]:
    """ETDump (+ debug buffer holding the program outputs) of a case-0 run."""
    import tempfile

    import torch

    from bundlerun.bundles.bpte import parse_bundle

    pl = _runtime()
    bundle = parse_bundle(model, in_memory=True)  # linked into an "ELF": other data follows, as on a device
    case = bundle.method_test_suites[0].test_cases[0]
    inputs = [torch.from_numpy(v.to_array().copy()) if v.kind == "tensor" else v.scalar for v in case.inputs]
    module = pl._load_for_executorch_from_buffer(bundle.program, enable_etdump=True, debug_buffer_size=1 << 20)
    module.run_method(method, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        etdump_path, debug_path = Path(tmp, "etdump.bin"), Path(tmp, "debug_buffer.bin")
        module.write_etdump_result_to_file(str(etdump_path), str(debug_path))
        debug = debug_path.read_bytes() if debug_path.exists() else b""
        return etdump_path.read_bytes(), debug


def _perturb(arr):
    import numpy as np

    if arr.dtype.kind == "f":
        return (arr + np.asarray(0.5, dtype=arr.dtype)).astype(arr.dtype)
    if arr.dtype.kind == "b":
        return ~arr
    return (arr.astype(np.int64) + 3).astype(arr.dtype)


def _error_stats(outputs, expected) -> tuple[float, float, float, float]:
    import numpy as np

    abs_all, rel_all = [], []
    for a, r in zip(outputs, expected):
        if a.size != r.size:
            continue
        a64, r64 = a.astype(np.float64).ravel(), r.astype(np.float64).ravel()
        d = np.abs(a64 - r64)
        abs_all.append(d)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_all.append(np.where(r64 != 0, d / np.abs(r64), np.where(d == 0, 0.0, np.inf)))
    if not abs_all:
        return (0.0, 0.0, 0.0, 0.0)
    d, rel = np.concatenate(abs_all), np.concatenate(rel_all)
    return float(d.mean()), float(d.max()), float(rel.mean()), float(rel.max())


def _cpp_verify(outputs, expected, rtol: float, atol: float) -> bool:
    """verify_method_outputs: float/double/half within atol + rtol*|actual|, else byte-equal."""
    import numpy as np

    for a, r in zip(outputs, expected):
        if a.shape != r.shape or a.dtype != r.dtype:
            return False
        if a.dtype.kind == "f":
            a64, r64 = a.astype(np.float64), r.astype(np.float64)
            both_nan = np.isnan(a64) & np.isnan(r64)
            if not np.all(both_nan | (np.abs(a64 - r64) <= atol + rtol * np.abs(a64))):
                return False
        elif a.tobytes() != r.tobytes():
            return False
    return True


def _print_output_lines(i: int, arr, stream) -> None:
    kind = {"f": "float", "i": "int", "b": "bool"}.get(arr.dtype.kind)
    if arr.dtype.kind == "i" and arr.dtype.itemsize == 1:
        kind = "char"
    if kind is None or (arr.dtype.kind == "i" and arr.dtype.itemsize not in (1, 4)):
        return  # the runner prints only Int, Float, Char and Bool tensors
    lines = []
    for j, v in enumerate(arr.ravel().tolist()):
        if kind == "float":
            lines.append(f"Output[{i}][{j}]: (float) {v:f}")
        elif kind == "bool":
            lines.append(f"Output[{i}][{j}]: (bool) {'true ' if v else 'false'} (0x{int(v):x})")
        else:
            lines.append(f"Output[{i}][{j}]: ({kind}) {v}")
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def main() -> None:
    name = Path(sys.argv[0]).name
    if name not in PLATFORMS:
        sys.stderr.write(f"fvp_double: unknown platform {name!r}; install under one of {', '.join(PLATFORMS)}\n")
        sys.exit(2)
    if "--version" in sys.argv[1:]:  # a version probe, not a simulation: nothing to record
        sys.stdout.write(VERSION_TEXT)
        sys.exit(0)
    args_file = os.environ.get("BUNDLERUN_FVP_ARGSFILE")
    if args_file:
        with open(args_file, "a") as f:
            f.write(json.dumps(sys.argv) + "\n")
    _record_pid(os.getpid())
    fvp = Fvp(name)
    fvp.parse(sys.argv[1:])
    fvp.main()


if __name__ == "__main__":
    main()
