"""The serial lane against a real UART: ExecuTorch's own arm_executor_runner (uart build, from
firmware_scripts/arm/build_qemu_runner.sh --mode uart) on the real qemu-system-arm, its UART0 a
TCP server (`-serial tcp:...,server=on,wait=on`), driven through `serial+socket://` exactly as a
board: per case, the target launches the "board" (QEMU holding that case's one-case bundle at
0x7C000000 via -device loader), connects, captures until the runner's EOT and stops the board's
whole process group. No double anywhere except a byte relay that puts line noise on the wire.

Every QEMU started must be gone at the end of each test, whichever way the case ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.targets import open_target
from bundlerun.targets.base import CaseStatus, RunOptions
from bundlerun.targets.failures import FailureKind
from bundlerun.targets.runner_cache import read_record

from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
MODEL_ADDR = "0x7C000000"
QEMU_UART = ("qemu-system-arm -M mps3-an547 -nographic -monitor none "
             "-serial tcp:{host}:{tcp_port},server=on,wait=on "
             f"-device loader,file={{case_bundle}},addr={MODEL_ADDR} -kernel {{elf}}")

# A byte relay between bundlerun and QEMU's UART: `noise` adds junk (NULs, 0xFF, broken UTF-8,
# escape sequences, CR) before the first line and after every line; `garble` flips the top bit
# of every byte but the newline, as a wrong baud rate does. Both directions pass through.
RELAY = r'''
import select, socket, sys, time
listen, upstream, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
NOISE = b"\x00\xff\xfe\x80\x1b[0m\xc3\x28 line noise \xa0\xa1\r\n"
srv = socket.create_server(("127.0.0.1", listen))
client, _ = srv.accept()
deadline = time.monotonic() + 10
while True:
    try:
        up = socket.create_connection(("127.0.0.1", upstream)); break
    except OSError:
        if time.monotonic() > deadline: sys.exit("relay: QEMU never listened on %d" % upstream)
        time.sleep(0.05)
def transform(data):
    if mode == "noise":
        return data.replace(b"\n", b"\n" + NOISE)
    return bytes(b if b == 10 else b ^ 0x80 for b in data)
if mode == "noise":
    client.sendall(NOISE)
while True:
    ready, _, _ = select.select([client, up], [], [])
    for s in ready:
        data = s.recv(65536)
        if not data: sys.exit(0)
        (client if s is up else up).sendall(transform(data) if s is up else data)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _leftovers(marker: str) -> list[str]:
    """Live processes (QEMU, relay) whose command line holds `marker` (this test's tmp path or
    port): other engineers' QEMU runs on this machine are not ours to count."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if marker in ln and "ps -ww" not in ln and " Z" not in ln[:12]]


def _qemu_pids(marker: str) -> list[int]:
    return [int(ln.split()[0]) for ln in _leftovers(marker) if "qemu-system-arm" in ln]


@pytest.fixture(scope="module")
def uart_elf(qemu_runner) -> Path:
    folder = qemu_runner("--mode", "uart")
    record = read_record(folder)
    assert record["mode"] == "uart" and record["flags"]["model_addr"] == MODEL_ADDR, record
    return folder / "arm_executor_runner.elf"


@pytest.fixture(scope="module")
def spin_elf(qemu_runner) -> Path:
    return qemu_runner("--mode", "uart", "--fault", "spin") / "arm_executor_runner.elf"


@pytest.fixture(scope="module")
def int8_bundle(bundle_cache) -> Path:
    return bundle_cache("mlp", "int8", backend="cortex-m", cases=3, target="qemu://mps3-an547")


@pytest.fixture(scope="module")
def fp32_bundle(bundle_cache) -> Path:
    return bundle_cache("mlp", "fp32", backend="portable", cases=3, target="qemu://mps3-an547")


@pytest.fixture(scope="module")
def semihosting_outputs(qemu_runner, int8_bundle, tmp_path_factory):
    """The same cases on the semihosting runner (qemu://, outputs as out-<i>.bin, bit exact):
    what the UART's printed lines must reproduce to 6 decimals, case by case."""
    qemu_runner()  # the zoo-ops semihosting runner qemu:// picks from the cache
    target = open_target("qemu://mps3-an547", {})
    run = target.run(read_bundle(int8_bundle), int8_bundle,
                     RunOptions(work_dir=tmp_path_factory.mktemp("semihosting"), case_timeout_s=60, retries=0))
    assert [c.status for c in run.cases] == [CaseStatus.OK] * 3, [(c.error_kind, c.error) for c in run.cases]
    assert all(c.extra["outputs_from"] == "files" for c in run.cases)
    return [[o.to_array() for o in c.outputs] for c in run.cases]


def _run(url: str, config: dict, bundle: Path, work: Path, **opts):
    target = open_target(url, config)
    options = RunOptions(work_dir=work, **{"case_timeout_s": 30.0, "retries": 0, **opts})
    return target.run(read_bundle(bundle), bundle, options)


def _assert_matches(case, reference: list[np.ndarray]) -> None:
    got = [o.to_array() for o in case.outputs]
    assert len(got) == len(reference)
    for a, r in zip(got, reference):
        assert a.shape == r.shape and a.dtype == r.dtype
        # printed with %f: 6 decimals, then stored back into float32
        np.testing.assert_allclose(a, r, rtol=0, atol=1.5e-6)


# ------------------------------------------------------------------------------ passing runs


def test_every_case_of_real_bundles_over_qemus_uart(uart_elf, int8_bundle, fp32_bundle, semihosting_outputs, tmp_path):
    """`bundlerun run` through serial+socket:// with a per-case launch: every case of an int8
    Cortex-M (CMSIS-NN) and an fp32 portable bundle runs in its own QEMU, every output is judged
    on the host, and the printed outputs are those of the bit-exact semihosting lane, case by case."""
    for name, bundle in (("int8", int8_bundle), ("fp32", fp32_bundle)):
        port = _free_port()
        t0 = time.monotonic()
        res = run_cli("run", str(bundle), "--target", f"serial+socket://127.0.0.1:{port}",
                      "--target-opt", f"elf={uart_elf}", "--target-opt", f"launch={QEMU_UART}",
                      "--report", str(tmp_path / name), "--no-history", "--timeout", "60")
        wall = time.monotonic() - t0
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        report = json.loads((tmp_path / name / "report.json").read_text())
        assert report["target"]["info"]["per_case_launch"] is True
        assert report["summary"]["counts"]["PASS"] == 3 and report["summary"]["outputs"] == 3
        for i, case in enumerate(report["cases"]):
            assert case["case"] == i and case["verdict"] == "PASS", case
            assert case["extra"]["outputs_from"] == "printed" and case["extra"]["capture_status"] == "finished"
            assert case["device_verdict"]["verdict"] == "PASS"  # the runner checked *this* case as its case 0
            for out in case["outputs"]:
                assert out["verdict"] == "PASS" and out["lossy"] is True
                assert out["stats"]["actual_stats"]["numel"] == 10 and out["stats"]["sqnr"] > 20
            raw = Path(case["log_path"]).read_bytes()  # the raw UART capture of this case
            assert raw.rstrip().endswith(b"\x04") and b"Program complete, exiting." in raw
            launch_log = Path(case["extra"]["launch_log"]).read_text()
            assert f"tcp:127.0.0.1:{port},server=on,wait=on" in launch_log
            assert f"forward-case{i}.bpte" in launch_log  # QEMU held this case's one-case bundle
        print(f"{name}: 3 cases over QEMU's UART in {wall:.1f}s (CLI included)")
        assert not _leftovers(f"127.0.0.1:{port}")
    # The UART's printed values are the semihosting lane's bit-exact outputs, to 6 decimals.
    port = _free_port()
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": QEMU_UART}, int8_bundle,
               tmp_path / "api")
    assert [c.status for c in run.cases] == [CaseStatus.OK] * 3
    for case, reference in zip(run.cases, semihosting_outputs):
        _assert_matches(case, reference)
    assert not np.array_equal(semihosting_outputs[0][0], semihosting_outputs[1][0])  # cases really differ
    assert not _leftovers(str(tmp_path))


def test_line_noise_on_the_uart_still_gives_the_same_outputs(uart_elf, int8_bundle, semihosting_outputs, tmp_path):
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    port, qemu_port = _free_port(), _free_port()
    launch = (f"sh -c '{QEMU_UART.replace('{host}:{tcp_port}', f'127.0.0.1:{qemu_port}')} & "
              f"exec {sys.executable} {relay} {{tcp_port}} {qemu_port} noise'")
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": launch}, int8_bundle, tmp_path,
               cases=[1, 2])
    for case, reference in zip(run.cases, semihosting_outputs[1:]):
        assert case.status == CaseStatus.OK, (case.error_kind, case.error)
        _assert_matches(case, reference)
        raw = Path(case.log_path).read_bytes()
        assert raw.count(b"line noise") > 20  # the noise really was on the wire
        with pytest.raises(UnicodeDecodeError):
            raw.decode("utf-8")
    assert not _leftovers(str(tmp_path)) and not _leftovers(str(qemu_port))


# ------------------------------------------------------------------------------ faults


def test_garbled_uart_is_a_timeout_that_names_the_baud_rate(uart_elf, int8_bundle, tmp_path):
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    port, qemu_port = _free_port(), _free_port()
    launch = (f"sh -c '{QEMU_UART.replace('{host}:{tcp_port}', f'127.0.0.1:{qemu_port}')} & "
              f"exec {sys.executable} {relay} {{tcp_port}} {qemu_port} garble'")
    t0 = time.monotonic()
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": launch}, int8_bundle, tmp_path,
               cases=[0], case_timeout_s=3)
    (case,) = run.cases
    assert case.status == CaseStatus.TIMEOUT and case.error_kind == FailureKind.HOST_TIMEOUT, (case.error_kind, case.error)
    assert "none a runner line: wrong baud rate 115200?" in case.error, case.error
    assert case.extra["bytes"] > 2000  # the whole log arrived, garbled
    assert 3 <= time.monotonic() - t0 < 15
    assert not _leftovers(str(tmp_path)) and not _leftovers(str(qemu_port))


def test_hung_runner_times_out_and_every_qemu_is_reaped(spin_elf, int8_bundle, tmp_path):
    port = _free_port()
    t0 = time.monotonic()
    res = run_cli("run", str(int8_bundle), "--target", f"serial+socket://127.0.0.1:{port}", "--select", "0,1",
                  "--target-opt", f"elf={spin_elf}", "--target-opt", f"launch={QEMU_UART}",
                  "--report", str(tmp_path / "r"), "--no-history", "--timeout", "3")
    wall = time.monotonic() - t0
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [c["case"] for c in report["cases"]] == [0, 1]
    for case in report["cases"]:
        assert case["verdict"] == "TIMEOUT" and case["error_kind"] == "host-timeout", case
        assert "still running at the wall-clock bound" in case["error"]
        assert any("Starting running 1 inferences" in line for line in case["log_excerpt"])
        assert 3 <= case["elapsed_s"] < 6
        assert case["extra"]["attempts"] == 1  # a hang is not retried
    assert wall < 40
    assert not _leftovers(f"127.0.0.1:{port}") and not _leftovers(str(tmp_path))


def _kill_qemu_when(log: Path, needle: bytes, marker: str, killed: list, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_bytes():
            pids = _qemu_pids(marker)
            if pids:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                killed.extend(pids)
                return
        time.sleep(0.05)


def test_qemu_dying_mid_case_is_a_crash_not_a_hang(spin_elf, int8_bundle, tmp_path):
    """QEMU killed while the runner executes (it spins in Method::execute): the case ends at
    once as a crash naming the signal, is not retried, and nothing is left running."""
    port = _free_port()
    killed: list[int] = []
    watcher = threading.Thread(target=_kill_qemu_when, daemon=True,
                               args=(tmp_path / "serial" / "forward-case0.uart.log", b"Starting running",
                                     f"tcp:127.0.0.1:{port},", killed))
    watcher.start()
    t0 = time.monotonic()
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(spin_elf), "launch": QEMU_UART}, int8_bundle,
               tmp_path, cases=[0], case_timeout_s=60, retries=1)
    watcher.join(timeout=5)
    (case,) = run.cases
    assert killed, "the watcher never saw the runner start"
    assert case.status == CaseStatus.ERROR and case.error_kind == FailureKind.CRASH, (case.error_kind, case.error)
    assert "qemu-system-arm" in case.error and "killed by signal 9" in case.error and "mid-case" in case.error
    assert case.extra["board_returncode"] == -9 and case.extra["transport_fault"] == "board-exited"
    assert case.extra["attempts"] == 1
    assert time.monotonic() - t0 < 20  # ended by the death, not by the 60 s case bound
    assert not _leftovers(str(tmp_path))


def test_ctrl_c_mid_case_stops_qemu(spin_elf, int8_bundle, tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bundlerun.runner.cli import main; main()", "run", str(int8_bundle),
         "--target", f"serial+socket://127.0.0.1:{port}", "--target-opt", f"elf={spin_elf}",
         "--target-opt", f"launch={QEMU_UART}", "--report", str(tmp_path / "r"), "--no-history", "--timeout", "300"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    uart = tmp_path / "r" / "work" / "serial" / "forward-case0.uart.log"
    try:
        deadline = time.monotonic() + 120
        while not (uart.exists() and b"Starting running" in uart.read_bytes()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the runner never started case 0"
            time.sleep(0.1)
        assert _qemu_pids(f"tcp:127.0.0.1:{port},")  # the board is up and spinning
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion must not leave the CLI (and its QEMU) behind
            proc.kill()
            proc.wait()
            for pid in _qemu_pids(f"tcp:127.0.0.1:{port},"):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["summary"]["interrupted"] is True
    assert all(c["error_kind"] == "interrupted" for c in report["cases"])
    assert not _leftovers(f"127.0.0.1:{port}") and not _leftovers(str(tmp_path))


def test_board_launch_failures_are_classified(uart_elf, int8_bundle, tmp_path):
    # QEMU itself refuses to start (no such kernel): fails at once with QEMU's own words.
    port = _free_port()
    t0 = time.monotonic()
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(tmp_path / "missing.elf"), "launch": QEMU_UART},
               int8_bundle, tmp_path / "a", cases=[0])
    (case,) = run.cases
    assert case.error_kind == FailureKind.TOOL_FAILED, (case.error_kind, case.error)
    # QEMU's wait=on holds the kernel load until bundlerun connects: it fails right after
    assert case.extra["transport_fault"] == "board-exited" and case.extra["board_returncode"] == 1
    assert "missing.elf" in case.error and "before the runner started" in case.error, case.error
    assert time.monotonic() - t0 < 10
    # QEMU exits before it ever listens (a typo in the machine name): no 10 s of connect retries
    t0 = time.monotonic()
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf),
               "launch": QEMU_UART.replace("mps3-an547", "mps3-an999")}, int8_bundle, tmp_path / "a2", cases=[0])
    (case,) = run.cases
    assert case.error_kind == FailureKind.TOOL_FAILED and case.extra["transport_fault"] == "launch-exited"
    assert "exited with code 1: qemu-system-arm: unsupported machine type" in case.error, case.error
    assert "could be opened" in case.error
    assert time.monotonic() - t0 < 5
    # the launch tool is not installed
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": "no-such-emulator-xyz {case_bundle}"},
               int8_bundle, tmp_path / "b", cases=[0])
    assert run.cases[0].error_kind == FailureKind.TOOL_MISSING and "no-such-emulator-xyz" in run.cases[0].error
    # something else already listens where the board should: never talk to the wrong board
    with socket.create_server(("127.0.0.1", port)):
        run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": QEMU_UART},
                   int8_bundle, tmp_path / "c", cases=[0])
    assert run.cases[0].error_kind == FailureKind.TRANSPORT and run.cases[0].extra["transport_fault"] == "port-busy"
    assert "already in use" in run.cases[0].error
    assert not _leftovers(str(tmp_path))


def test_launch_once_for_the_run_without_case_bundle(uart_elf, int8_bundle, tmp_path):
    """A launch without {case_bundle} is one board for the whole run (like a board flashed
    once): case 0 runs against the full bundle, the other cases are skipped, never misjudged."""
    port = _free_port()
    launch = QEMU_UART.replace("{case_bundle}", "{bundle}")
    run = _run(f"serial+socket://127.0.0.1:{port}", {"elf": str(uart_elf), "launch": launch}, int8_bundle, tmp_path)
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.SKIP, CaseStatus.SKIP]
    assert run.info["per_case_launch"] is False and "launch" in run.logs
    assert str(int8_bundle.resolve()) in Path(run.logs["launch"]).read_text()
    assert not _leftovers(str(int8_bundle))


def test_doctor_checks_the_launch_tool(tmp_path):
    config = tmp_path / "bundlerun.toml"
    config.write_text('[targets.serial]\nlaunch = "qemu-system-arm -M mps3-an547 -kernel {elf}"\n'
                      'flash = "no-such-flasher-xyz {case_bundle}"\n')
    res = run_cli("doctor", "--json", "--config", str(config))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["component"]: r for r in json.loads(res.stdout)["checks"] if r["target"] == "serial"}
    assert rows["serial launch"]["ok"] is True and rows["serial launch"]["where"].endswith("qemu-system-arm")
    assert rows["serial flash"]["ok"] is False and "no-such-flasher-xyz not on PATH" in rows["serial flash"]["detail"]
