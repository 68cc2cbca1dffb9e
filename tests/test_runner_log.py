"""The Arm runner-log parser on real runner output and on damaged variants.

The `REAL_*` texts are log output of arm_executor_runner as published in
ExecuTorch's docs/issues and Arm's learning paths (three generations of the
ET_LOG prefix). `BUNDLEIO_*` follow the current arm_executor_runner.cpp format
strings line for line (verify_result(), print_outputs(), write_etdump(), main()).
"""

from __future__ import annotations

import base64
import math
import random

import pytest

from bundlerun.targets.et_runner.log import IncrementalLogParser, parse_line, parse_runner_log

# Arm learning path (Corstone-320, runner ~2025): current prefix with function name.
REAL_LEARNING_PATH = """\
telnetterminal0: Listening for serial connection on port 5000
telnetterminal1: Listening for serial connection on port 5001
telnetterminal2: Listening for serial connection on port 5002
telnetterminal5: Listening for serial connection on port 5003
I [executorch:arm_executor_runner.cpp:489 main()] PTE in 0x70000000 $ Size: 433968 bytes
I [executorch:arm_executor_runner.cpp:514 main()] PTE Model data loaded. Size: 433968 bytes.
I [executorch:arm_executor_runner.cpp:527 main()] Model buffer loaded, has 1 methods
I [executorch:arm_executor_runner.cpp:535 main()] Running method forward
I [executorch:arm_executor_runner.cpp:546 main()] Setup Method allocator pool. Size: 62914560 bytes.
I [executorch:arm_executor_runner.cpp:563 main()] Setting up planned buffer 0, size 3920.
I [executorch:EthosUBackend.cpp:116 init()] data:0x70000070
"""

# ExecuTorch Arm tutorial (ethos-u85-128, runner ~2024): prefix without function.
REAL_TUTORIAL = """\
I [executorch:arm_executor_runner.cpp:675] Model executed successfully.
I [executorch:arm_executor_runner.cpp:679] 1 outputs:
Output[0][0]: (int) 2
Output[0][1]: (int) 2
Output[0][2]: (int) 2
Output[0][3]: (int) 2
Output[0][4]: (int) 2
I [executorch:arm_executor_runner.cpp:783] Program complete, exiting.
I [executorch:arm_executor_runner.cpp:787] \x04
Info: /OSCI/SystemC: Simulation stopped by user.
[backends/arm/scripts/run_fvp.sh] Simulation complete, 0
"""

# Early Arm delegate tutorial (2023): no '[' before executorch, untyped outputs.
REAL_EARLY = """\
    Ethos-U rev 136b7d75 --- Apr 12 2023 13:44:01
    (C) COPYRIGHT 2019-2023 Arm Limited
    ALL RIGHTS RESERVED

I executorch:arm_executor_runner.cpp:60] Model in 0x70000000 $
I executorch:arm_executor_runner.cpp:66] Model PTE file loaded. Size: 4556832 bytes.
I executorch:arm_executor_runner.cpp:77] Model buffer loaded, has 1 methods
I executorch:arm_executor_runner.cpp:85] Running method forward
I executorch:ArmBackendEthosU.cpp:49] ArmBackend::init 0x70000060
I executorch:runner.cpp:121] Model executed successfully.
I executorch:runner.cpp:125] 1 outputs:
Output[0][0]: -0.640891
Output[0][1]: 1.319481
Application exit code: 0.

EXITTHESIM

Info: Simulation is stopping. Reason: CPU time has been exceeded.
"""

# ExecuTorch issue #7568: semihosting runner that never printed, killed by --timelimit.
REAL_HANG = """\
Running /home/user/executorch/examples/arm/executor_runner/cmake-out/arm_executor_runner for ethos-u55-128 run with FVP:FVP_Corstone_SSE-300_Ethos-U55 num_macs:128
telnetterminal0: Listening for serial connection on port 5000
telnetterminal1: Listening for serial connection on port 5001

    Ethos-U rev 136b7d75 --- Apr 12 2023 13:44:01
    (C) COPYRIGHT 2019-2023 Arm Limited
    ALL RIGHTS RESERVED


Info: Simulation is stopping. Reason: CPU time has been exceeded.

Info: /OSCI/SystemC: Simulation stopped by user.
[warning ][main@0][1300 ns] Simulation stopped by user
"""

# Arm ML platform forum: Corstone-300 FVP application hitting a bus fault.
REAL_BUS_FAULT = """\
    Ethos-U rev 136b7d75 --- Nov 25 2021 12:05:57
    (C) COPYRIGHT 2019-2021 Arm Limited
    ALL RIGHTS RESERVED

INFO - Processor internal clock: 32000000Hz
WARN - MPS3_SCC->CFG_ACLK reads 0. Assuming default clock of 32000000
sh: xterm: command not found
INFO - CPU: Cortex-M55 r1p0
INFO - Ethos-U device initialised
INFO - Arm Corstone-300 (SSE-300) platform initialised
Exception caught by function BusFault_Handler
CTRL : 0x0000000c
IPSR : 0x00000005
"""

_P = "I [executorch:arm_executor_runner.cpp:{} {}()] {}"


def _i(line: int, msg: str, func: str = "main") -> str:
    return _P.format(line, func, msg)


def _e(line: int, msg: str, func: str = "verify_result") -> str:
    return "E" + _P.format(line, func, msg)[1:]


BUNDLEIO_PASS = "\n".join(
    [
        _i(1280, "Running executor with parameter:"),
        _i(1285, "   executor_runner"),
        _i(1287, "   -m model.bpte"),
        _i(1287, "   -i dummy.bin"),
        _i(1287, "   -o out"),
        _i(1326, "Reading pte model from file model.bpte"),
        _i(1356, "PTE @ 0x70000040 [----BP08]"),
        _i(551, "PTE Model data loaded. Size: 1312 bytes.", "runner_init"),
        _i(1130, "Starting running 1 inferences...", "run_model"),
        _i(1152, "1 inferences finished", "run_model"),
        _i(889, "1 outputs: ", "print_outputs"),
        _i(933, "Writing output to file: out-0.bin", "print_outputs"),
        _i(1092, "=== Error stats for testset 0 ===", "verify_result"),
        _i(1093, " mean_absolute_error: 0.000012", "verify_result"),
        _i(1094, " max_absolute_error:  0.000048", "verify_result"),
        _i(1095, " mean_relative_error: 0.000003", "verify_result"),
        _i(1096, " max_relative_error:  0.000101", "verify_result"),
        _i(1106, "Model output match expected BundleIO bpte ref data.", "verify_result"),
        _i(1107, "TEST: BundleIO index[0] Test_result: PASS", "verify_result"),
        _i(1156, "Model run: 1", "run_model"),
        _i(1362, "Model run: 1"),
        _i(1369, "Program complete, exiting."),
        "Info: Simulation is stopping. Reason: Simulation stopped by semihosting exit.",
        "",
    ]
)

BUNDLEIO_FAIL = "\n".join(
    [
        _i(1356, "PTE @ 0x70000000 [----BP08]"),
        _i(1092, "=== Error stats for testset 0 ===", "verify_result"),
        _i(1093, " mean_absolute_error: 0.512000", "verify_result"),
        _i(1094, " max_absolute_error:  1.750000", "verify_result"),
        _i(1095, " mean_relative_error: 0.250000", "verify_result"),
        _i(1096, " max_relative_error:  inf", "verify_result"),
        _e(1110, "Model output don't match expected BundleIO bpte ref data. rtol=0.010000 atol=0.010000"),
        _e(1115, "TEST: BundleIO index[0] Test_result: FAIL"),
        _e(1117, "Bundle verification failed with status 0x12"),
        _i(1156, "Model run: 0", "run_model"),
        "F [executorch:arm_executor_runner.cpp:1366 main()] In function main(), assert failed (model_ok == true): Problem running model",
        "",
    ]
)


def test_current_prefix_with_function_and_fvp_lines():
    log = parse_runner_log(REAL_LEARNING_PATH)
    runner = [ln for ln in log.lines if ln.level]
    assert len(runner) == 7
    assert runner[0].file == "arm_executor_runner.cpp" and runner[0].line == 489
    assert runner[0].func == "main"
    assert runner[0].message == "PTE in 0x70000000 $ Size: 433968 bytes"
    assert runner[-1].file == "EthosUBackend.cpp" and runner[-1].func == "init"
    assert [ln.level for ln in log.lines[:4]] == [None] * 4  # telnet notices
    assert log.boots == 1
    assert not log.program_complete and not log.errors and not log.fatal
    assert log.bundle_verdict is None


def test_older_prefix_printed_outputs_and_eot():
    log = parse_runner_log(REAL_TUTORIAL)
    assert log.lines[0].level == "I" and log.lines[0].line == 675 and log.lines[0].func is None
    assert log.printed_outputs == {0: [("int", 2)] * 5}
    assert log.program_complete and log.eot_seen
    assert not log.cpu_time_exceeded and not log.errors


def test_early_prefix_untyped_outputs_and_timelimit():
    log = parse_runner_log(REAL_EARLY)
    runner = [ln for ln in log.lines if ln.level]
    assert runner[0].file == "arm_executor_runner.cpp" and runner[0].line == 60
    assert runner[0].message == "Model in 0x70000000 $"
    assert log.printed_outputs[0] == [("untagged", -0.640891), ("untagged", 1.319481)]  # takes the bundle dtype
    assert log.cpu_time_exceeded and log.fatal == ["Info: Simulation is stopping. Reason: CPU time has been exceeded."]
    assert log.simulation_stopped == "CPU time has been exceeded."
    assert log.boots == 1 and log.banners == 1


def test_hang_without_runner_output():
    log = parse_runner_log(REAL_HANG)
    assert not any(ln.level for ln in log.lines)
    assert log.cpu_time_exceeded and not log.program_complete
    assert log.boots == 1  # the FVP banner is the only sign of a start
    assert "[warning ][main@0][1300 ns] Simulation stopped by user" in [ln.raw for ln in log.lines]


def test_platform_fault_handler_is_fatal():
    log = parse_runner_log(REAL_BUS_FAULT)
    assert log.fatal == ["Exception caught by function BusFault_Handler"]
    assert log.crashed and not any(ln.level for ln in log.lines)  # 'INFO - ' is not an ET_LOG line


def test_bundleio_pass_markers_and_stats():
    log = parse_runner_log(BUNDLEIO_PASS)
    assert log.bundle_verdict == "PASS"
    assert log.error_stats == {
        "mean_absolute_error": 0.000012,
        "max_absolute_error": 0.000048,
        "mean_relative_error": 0.000003,
        "max_relative_error": 0.000101,
    }
    assert log.verification_status is None and log.verdict_tolerances == {}
    assert log.program_complete and log.model_run_ok is True
    assert log.output_files == ["out-0.bin"]
    assert log.boots == 1  # 'Running executor' + its 'PTE @' are one start
    assert log.simulation_stopped.startswith("Simulation stopped by semihosting")
    assert log.errors == [] and log.fatal == []


def test_bundleio_fail_markers():
    log = parse_runner_log(BUNDLEIO_FAIL)
    assert log.bundle_verdict == "FAIL"
    assert log.verdict_tolerances == {"rtol": 0.01, "atol": 0.01}
    assert log.verification_status == 0x12
    assert math.isinf(log.error_stats["max_relative_error"])
    assert log.error_stats["max_absolute_error"] == 1.75
    assert [e.level for e in log.errors] == ["E", "E", "E", "F"]
    assert log.crashed and any("assert failed" in f for f in log.fatal)
    assert log.model_run_ok is False and not log.program_complete
    excerpt = log.excerpt()
    assert any("Test_result: FAIL" in x for x in excerpt)
    assert any("max_absolute_error" in x for x in excerpt)


def _etdump_block(payload: bytes, debug: bytes | None = None) -> list[str]:
    lines = ["#[RUN THIS]"]
    if debug is not None:
        lines += ["# Writing debug_buffer.bin [base64]", f'echo "{base64.b64encode(debug).decode()}" | base64 -d >debug_buffer.bin']
    lines += [
        "# Writing etdump.bin [base64]",
        f'echo "{base64.b64encode(payload).decode()}" | base64 -d >etdump.bin',
        "# Generate cpu cycle table with:",
        "python3 -m devtools.inspector.inspector_cli --etdump_path etdump.bin  --source_time_scale cycles --target_time_scale cycles",
        "#[END]",
    ]
    return lines


def test_etdump_block_current_format():
    payload = bytes(range(200))
    text = "\r\n".join([_i(1356, "PTE @ 0x70000000 [----BP08]")] + _etdump_block(payload, b"\x01\x02\x03") + [_i(1369, "Program complete, exiting."), ""])
    log = parse_runner_log(text)
    assert log.etdump_complete
    assert base64.b64decode(log.etdump_b64) == payload
    assert base64.b64decode(log.debug_buffer_b64) == b"\x01\x02\x03"
    assert log.program_complete


def test_etdump_block_bare_base64_wrapped():
    payload = bytes(random.Random(1).randrange(256) for _ in range(300))
    b64 = base64.b64encode(payload).decode()
    chunks = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    log = parse_runner_log("\n".join(["#[RUN THIS]", *chunks, "#[END]", ""]))
    assert log.etdump_complete and base64.b64decode(log.etdump_b64) == payload


def test_etdump_block_incomplete_is_none():
    lines = _etdump_block(b"abc")[:-1]  # no #[END]
    log = parse_runner_log("\n".join(lines))
    assert log.etdump_b64 is None and not log.etdump_complete


def test_partial_last_line_and_crlf_mix():
    text = b"I [executorch:a.cpp:1 main()] one\r\nI [executorch:a.cpp:2 main()] two\rI [executorch:a.cpp:3 main()] three\nE [executorch:a.cpp:4 main()] trunc"
    log = parse_runner_log(text)
    assert [ln.message for ln in log.lines] == ["one", "two", "three", "trunc"]
    assert log.partial_last_line == "E [executorch:a.cpp:4 main()] trunc"
    assert len(log.errors) == 1


def test_garbage_and_non_utf8_are_tolerated():
    text = b"\xff\xfe\x00garbage\x1b[0m\n\x80\x81I [executorch:arm_executor_runner.cpp:9 main()] Program complete, exiting.\n"
    log = parse_runner_log(text)
    assert log.program_complete  # runner line found after garbage on the same line
    assert log.lines[0].level is None and "\ufffd" in log.lines[0].raw


def test_reboot_counts_boots():
    one = BUNDLEIO_PASS.split("\n")[:8]
    log = parse_runner_log("\n".join(one + ["Hard fault. ", *one]))
    assert log.boots == 2
    assert log.fatal == ["Hard fault. "]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_incremental_feed_matches_whole_parse(chunk):
    payload = bytes(range(97))
    text = (
        "WARNING: something odd\r\n"
        + "\r\n".join(BUNDLEIO_PASS.split("\n")[:-2])
        + "\r\n"
        + "\r\n".join(_etdump_block(payload))
        + "\r\nOutput[0][0]: (float) 0.500000\r\nOutput[0][1]: (bool) true  (0x1)\r\nOutput[1][0]: (char) -3\r\n"
        + _i(1369, "Program complete, exiting.")
        + "\r\n"
        + _i(1373, "\x04")
        + "\r\n"
    ).encode()
    parser = IncrementalLogParser()
    got = []
    finished_at = None
    for k in range(0, len(text), chunk):
        got.extend(parser.feed(text[k : k + chunk]))
        if finished_at is None and parser.finished:
            finished_at = k
    whole = parse_runner_log(text)
    assert [ln.raw for ln in got] == [ln.raw for ln in whole.lines]
    res = parser.result()
    assert res.partial_last_line is None
    assert res.printed_outputs == {0: [("float", 0.5), ("bool", True)], 1: [("char", -3)]}
    assert base64.b64decode(res.etdump_b64) == payload
    assert res.eot_seen and res.program_complete and res.bundle_verdict == "PASS"
    assert parser.finished and finished_at is not None
    # finished only once the completion line arrived, not before
    assert finished_at >= text.index(b"Program complete") - chunk


def test_incremental_cr_split_across_chunks_is_one_line_break():
    parser = IncrementalLogParser()
    assert [ln.raw for ln in parser.feed(b"abc\r")] == []
    assert [ln.raw for ln in parser.feed(b"\ndef\r")] == ["abc"]
    assert parser.result().partial_last_line is None or parser.result().partial_last_line == "def"
    assert [ln.raw for ln in parser.feed(b"ghi\n")] == ["def", "ghi"]


def test_result_is_non_destructive_and_finished_rules():
    parser = IncrementalLogParser()
    parser.feed(b"#[RUN THIS]\n")
    parser.feed(_i(1369, "Program complete, exiting.").encode() + b"\n")
    assert not parser.finished  # still inside an ETDump block
    parser.feed(b'echo "QUJD" | base64 -d >etdump.bin\nI [executorch:x.cpp:1 main()] tail')
    mid = parser.result()
    assert mid.partial_last_line.endswith("tail") and mid.etdump_b64 is None
    parser.feed(b"\n#[END]\n")
    assert parser.finished
    res = parser.result()
    assert res.etdump_b64 == "QUJD" and [ln.message for ln in res.lines].count("tail") == 1


def test_eot_finishes_stream():
    parser = IncrementalLogParser()
    parser.feed(b"I [executorch:x.cpp:1 main()] hi\n")
    assert not parser.finished
    parser.feed(b"\x04")
    assert parser.finished and parser.result().eot_seen


def test_parse_line_non_runner():
    ln = parse_line("Info: Simulation is stopping. Reason: CPU time has been exceeded.")
    assert ln.level is None and ln.file is None and ln.message.startswith("Info:")
    ln = parse_line("D [executorch:method.cpp:1234 execute()] Executing method: forward")
    assert (ln.level, ln.file, ln.line, ln.func) == ("D", "method.cpp", 1234, "execute")


def test_large_logs_stream_in_linear_time():
    import os
    import time

    payload = os.urandom(1_500_000)
    lines = [f"Output[0][{j}]: (float) {j * 0.25:f}" for j in range(50_000)]
    text = ("\n".join(lines) + "\n#[RUN THIS]\n" f'echo "{base64.b64encode(payload).decode()}" | base64 -d >etdump.bin\n#[END]\n').encode()
    parser = IncrementalLogParser()
    t0 = time.process_time()  # CPU time: a quadratic parser costs minutes of it; a loaded machine's wall clock lies
    for k in range(0, len(text), 4096):  # UART-sized chunks; one 2 MB line among them
        parser.feed(text[k : k + 4096])
    log = parser.result()
    assert time.process_time() - t0 < 10
    assert len(log.printed_outputs[0]) == 50_000 and log.printed_outputs[0][-1] == ("float", 49_999 * 0.25)
    assert base64.b64decode(log.etdump_b64) == payload


def test_report_schema_documents_every_failure_kind():
    from pathlib import Path

    from bundlerun.targets.failures import FailureKind

    doc = (Path(__file__).resolve().parents[1] / "docs" / "report-schema.md").read_text()
    missing = [k.value for k in FailureKind if f"| `{k.value}` |" not in doc]
    assert not missing, f"docs/report-schema.md lacks {missing}"
    assert FailureKind.read("wrong-size-output") is FailureKind.WRONG_OUTPUT_SIZE  # old reports' synonyms
    assert FailureKind.read("hang") is FailureKind.HOST_TIMEOUT and FailureKind.parse(None) is None


# -- the one Arm runner protocol (targets.et_runner.protocol), on log text in the runner's own formats --

from bundlerun.targets.et_runner.protocol import SessionEnd, classify, collect_outputs  # noqa: E402
from bundlerun.targets.failures import FailureKind  # noqa: E402

_M = "I [executorch:arm_executor_runner.cpp:{n} main()] "





def test_success_marker_then_simulator_limit_is_a_success():
    log = parse_runner_log(_M.format(n=1) + "Model run: 1\n" + _M.format(n=2) + "Program complete, exiting.\n"
                           "Info: Simulation is stopping. Reason: CPU time has been exceeded.\n")
    assert classify(log, SessionEnd("exited", "FVP", 0)) is None
    old = parse_runner_log("I [executorch:arm_executor_runner.cpp:9] Model run: 1\nApplication exit code: 0.\nEXITTHESIM\n"
                           "Info: Simulation is stopping. Reason: CPU time has been exceeded.\n")
    assert old.program_complete and classify(old, SessionEnd("exited", "FVP", 0)) is None
    zephyr = parse_runner_log(_M.format(n=1) + "Model run: 1\nSUCCESS: Program complete, exiting.\n")
    assert zephyr.program_complete


def test_error_lines_then_silence_name_the_first_error_even_at_the_wall_clock_bound():
    log = parse_runner_log(_M.format(n=1) + "Model run: 1\n"
                           "E [executorch:method.cpp:100 execute()] Memory allocation failed: 2048B requested (adjusted for alignment), 100B available\n"
                           "E [executorch:method.cpp:120 execute()] second error\n")
    failure = classify(log, SessionEnd("host-timeout", "QEMU", None, "30s wall clock"))
    assert failure.kind is FailureKind.ALLOCATION_FAILURE and failure.status.value == "error"
    assert "2048 B requested, 100 B available" in failure.message


def test_missing_operator_and_backend_are_named():
    log = parse_runner_log("E [executorch:method.cpp:824 resolve_operator()] Missing operator: [3] aten::gelu.out\n"
                           "F [executorch:arm_executor_runner.cpp:760 runner_init()] In function runner_init(), assert failed\n")
    failure = classify(log, SessionEnd("exited", "QEMU", 1))
    assert failure.kind is FailureKind.MISSING_OPERATOR and "aten::gelu.out" in failure.message
    log = parse_runner_log("E [executorch:method.cpp:88 init()] Backend XnnpackBackend is not registered.\n")
    assert classify(log, SessionEnd("exited", "adb", 1)).kind is FailureKind.MISSING_BACKEND


def test_benign_lines_are_never_the_cause():
    log = parse_runner_log("E [executorch:method.cpp:1 set_output_data_ptr()] ignoring error from set_output_data_ptr(): 0x2\n"
                           + _M.format(n=2) + "Program complete, exiting.\n")
    assert classify(log, SessionEnd("exited", "FVP", 0)) is None


def test_timestamped_lines_and_portable_tensor_print():
    log = parse_runner_log("I 00:00:00.364824 executorch:executor_runner.cpp:76] Model file m.bpte is loaded.\n"
                           "OutputX 0: tensor(sizes=[2, 2], [1, 2,\n  3, 4])\n")
    assert log.lines[0].level == "I" and log.lines[0].file == "executor_runner.cpp"
    assert log.lines[0].message == "Model file m.bpte is loaded."
    assert [v for _, v in log.printed_outputs[0]] == [1, 2, 3, 4]
    from bundlerun.bundles import scalar_types as st

    got = collect_outputs(log, [(st.INT, [2, 2])], prefer="printed")
    assert got.source == "printed" and got.outputs[0].to_array().tolist() == [[1, 2], [3, 4]]
    # 6 significant digits: never used for a float output
    assert collect_outputs(log, [(st.FLOAT, [2, 2])], prefer="printed").kind is FailureKind.MISSING_OUTPUT


def test_untagged_printed_values_take_the_bundle_dtype_and_sizes_count_what_was_printed():
    from bundlerun.bundles import scalar_types as st

    log = parse_runner_log("Output[0][0]: 1.500000\nOutput[0][1]: -2.000000\n")
    got = collect_outputs(log, [(st.FLOAT, [2])], prefer="printed")
    assert got.outputs[0].to_array().tolist() == [1.5, -2.0] and got.outputs[0].lossy
    short = collect_outputs(log, [(st.FLOAT, [3])], prefer="printed")
    assert short.kind is FailureKind.WRONG_OUTPUT_SIZE and "has 2 printed values" in short.message


def test_a_failed_device_check_is_a_verdict_not_an_error():
    """Real log of arm_executor_runner on QEMU (digits-mlp int8, its compiled 0.01 tolerance):
    bundled_program.cpp's own mismatch line comes first; outputs are still collected."""
    text = (
        "I [executorch:arm_executor_runner.cpp:1299 verify_result()] === Error stats for testset 0 ===\n"
        "E [executorch:bundled_program.cpp:523 verify_method_outputs()] Method's output data mismatched the expected one.\n"
        "E [executorch:arm_executor_runner.cpp:1303 verify_result()] Model output don't match expected BundleIO bpte ref data. rtol=0.010000 atol=0.010000\n"
        "E [executorch:arm_executor_runner.cpp:1308 verify_result()] TEST: BundleIO index[0] Test_result: FAIL\n"
        "E [executorch:arm_executor_runner.cpp:1309 verify_result()] Bundle verification failed with status 0x20\n"
        "I [executorch:arm_executor_runner.cpp:1355 main()] Model run: 0\n"
        "F [executorch:arm_executor_runner.cpp:1548 main()] In function main(), assert failed (model_ok == true): Problem running model\n"
    )
    log = parse_runner_log(text)
    assert log.bundle_verdict == "FAIL"
    assert classify(log, SessionEnd("exited", "QEMU", 255)) is None
