"""Seeded fuzzing of what devices send back: runner logs (the FVP/QEMU/board stream) through
the one Arm-runner protocol, and the portable executor_runner's log + exit status. Whatever the
bytes, no exception escapes, nothing hangs, and a stream that lost its outputs is never judged.

Inputs: log texts in the real runners' formats (tests/test_runner_log.py and
firmware_scripts/arm/qemu/README.md), mutated by byte flips, truncation, splices and
injected control/garbage bytes; fed whole and split into random chunks."""

from __future__ import annotations

import random

import pytest

from bundlerun.bundles import scalar_types as st
from bundlerun.targets.et_runner import executor_runner
from bundlerun.targets.et_runner.log import IncrementalLogParser, parse_runner_log
from bundlerun.targets.et_runner.protocol import Collected, Failure, SessionEnd, classify, collect_outputs
from tests.test_runner_log import REAL_BUS_FAULT, REAL_EARLY, REAL_HANG, REAL_LEARNING_PATH, REAL_TUTORIAL

QEMU_PASS = (
    "I [executorch:arm_executor_runner.cpp:1406 main()] Running executor with parameter:\n"
    "I [executorch:arm_executor_runner.cpp:1299 verify_result()] Model output match expected BundleIO bpte ref data.\n"
    "I [executorch:arm_executor_runner.cpp:1300 verify_result()] TEST: BundleIO index[0] Test_result: PASS\n"
    "Output[0][0]: (float) 0.500000\nOutput[0][1]: (float) -1.250000\n"
    "I [executorch:arm_executor_runner.cpp:1355 main()] Model run: 1\n"
    "I [executorch:arm_executor_runner.cpp:1551 main()] Program complete, exiting.\n\x04"
)
PORTABLE = (
    "I 00:00:00.001 executorch:executor_runner.cpp:476] Model file model.bpte is loaded.\n"
    "E 00:00:00.002 executorch:method.cpp:824] Missing operator: [0] aten::_fft_r2c.out\n"
    "F 00:00:00.003 executorch:executor_runner.cpp:500] In function main(), assert failed: Loading of method forward failed\n"
)
CORPUS = [QEMU_PASS, PORTABLE, REAL_BUS_FAULT, REAL_EARLY, REAL_HANG, REAL_LEARNING_PATH, REAL_TUTORIAL]
LAYOUT = [(st.FLOAT, [2])]
N = 1000


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(6)
        if op == 0 and b:  # bit flip
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 2:  # inject controls / garbage / escapes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([b"\x00\x04\r", b"\xff\xfe\x1b[2J", b"\r\r\n", bytes(rng.randrange(256) for _ in range(8))])
        elif op == 3 and len(b) > 8:  # splice a chunk elsewhere (repeated lines, reboots)
            i, j = sorted(rng.sample(range(len(b)), 2))
            k = rng.randrange(len(b))
            b[k:k] = b[i:j]
        elif op == 4 and b:  # delete a range
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 40)]
        else:  # a huge value / line
            b += b"Output[0][" + str(rng.randrange(10 ** 9)).encode() + b"]: (float) 1e999\n"
    return bytes(b)


@pytest.mark.parametrize("seed", [0, 1])
def test_arm_runner_stream_never_escapes_or_judges_lost_outputs(seed):
    rng = random.Random(seed)
    judged = 0
    for _ in range(N):
        data = _mutate(rng, rng.choice(CORPUS).encode("utf-8", "replace"))
        whole = parse_runner_log(data)
        parser = IncrementalLogParser()
        pos = 0
        while pos < len(data):  # the same bytes as a UART delivers them
            step = rng.randint(1, 64)
            parser.feed(data[pos:pos + step])
            pos += step
        split = parser.result()
        assert [ln.raw for ln in split.lines] == [ln.raw for ln in whole.lines]
        end = SessionEnd(rng.choice(["exited", "finished", "host-timeout", "no-output", "transport-lost"]), "QEMU",
                         rng.choice([0, 1, 255, None]))
        failure = classify(whole, end)
        assert failure is None or (isinstance(failure, Failure) and failure.message and "\n" not in failure.message)
        if failure is None:
            got = collect_outputs(whole, LAYOUT, prefer="printed")
            assert isinstance(got, (Collected, Failure))
            if isinstance(got, Collected):
                judged += 1
                (out,) = got.outputs
                assert out.lossy and len(out.data) == 8  # exactly the layout, never a guess
    assert judged > 0  # the unmutated-enough streams still get through


def test_executor_runner_log_and_status_never_escape():
    rng = random.Random(7)
    for _ in range(N):
        text = _mutate(rng, rng.choice(CORPUS).encode()).decode("utf-8", "replace")
        status = rng.choice([0, 1, 2, 126, 127, 134, 137, 139, -6, -9, -11, 255])
        failure = executor_runner.classify(text, status)
        if status == 0:
            assert failure is None
        else:
            assert failure is None or (failure.kind and failure.message)
        verdict = executor_runner.device_verdict(text)
        assert verdict is None or verdict["verdict"] in ("PASS", "FAIL", None)
