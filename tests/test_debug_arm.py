"""`bundlerun debug` on the Arm runner lanes (targets/arm/intermediates.py).

Which runner each test uses:

* every test but the last: the REAL ExecuTorch arm_executor_runner
  (examples/arm/executor_runner/arm_executor_runner.cpp, compiled unmodified) built from source
  by firmware_scripts/arm/build_qemu_runner.sh - with `--etdump` (event tracer,
  ET_DUMP_INTERMEDIATE_OUTPUTS, ET_DEBUG_BUFFER_SIZE) where the test says so - and run on the REAL
  qemu-system-arm mps3-an547 (Cortex-M55). Runners are cached content-addressed after the first
  build (the first --etdump library build takes minutes, each later variant seconds).
* test_fvp_lane_reads_the_semihosting_etdump_files: the FVP test double (tests/doubles/fvp: no
  FVP can run here), which writes a real etdump.bin + debug_buffer.bin produced by ExecuTorch's
  pybindings into the semihosting cwd, as the real runner does.

The bundles are tests/test_debug.py's `fp32_bundles` (tiny-cnn portable fp32 with --etrecord, and
the same with conv2d_1's weights negated inside the program), imported from there.
A missing tool fails the test naming it (conftest's qemu_runner); nothing is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bundlerun.runner.debug.localize import debug_bundle
from bundlerun.targets.intermediates import IntermediatesFailed, IntermediatesUnsupported

from tests.conftest import run_cli
from tests.test_debug import assert_conv2d_1_first_bad, fp32_bundles  # noqa: F401 - fp32_bundles: the shared fixture
from bundlerun.targets.runner_cache import read_record

URL = "qemu://mps3-an547"
REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "firmware_scripts" / "arm" / "build_qemu_runner.sh"


def _qemu_alive(under: Path) -> list[str]:
    """Live QEMUs of this test: started with `under` (the test's tmp_path) as cwd or in their
    command line (other engineers' QEMU runs on this machine are not ours to count)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "qemu-system-arm" in args.split(" ", 1)[0] and state != "Z" and (cwd.startswith(str(under))
                                                                              or str(under) in args):
            found.append(f"{proc.name}: {args}")
    return found


def _shape(result) -> list[tuple]:
    """What must agree between lanes: per row the instruction, runtime op, status and eager ops."""
    return [(r.instruction, r.runtime_op, r.status, tuple(r.aot_ops)) for r in result.rows]


@pytest.fixture(scope="module")
def host_bad(fp32_bundles, tmp_path_factory):  # noqa: F811
    return debug_bundle(fp32_bundles / "bad.bpte", "host://portable", case=2,
                        work_dir=tmp_path_factory.mktemp("host"))


# ------------------------------------------------------------------ (a) the miscompiled conv, found on the device


def test_qemu_names_the_miscompiled_conv_exactly_as_host(fp32_bundles, host_bad, tmp_path):  # noqa: F811
    """The default path: no debug_elf, so bundlerun finds (or builds) the --etdump runner for this
    bundle's operators with a 64 MiB debug buffer (--debug-buffer-mb's default) and reads
    etdump.bin + debug_buffer.bin from the case's semihosting folder."""
    bad = debug_bundle(fp32_bundles / "bad.bpte", URL, case=2, work_dir=tmp_path / "bad")
    assert_conv2d_1_first_bad(bad)
    row = bad.first_bad_row
    # every row as on host://portable: same instructions, ops, matches; the same SQNR where it matters
    assert _shape(bad) == _shape(host_bad) and len(bad.rows) == 10
    assert row.fp32.sqnr == pytest.approx(host_bad.first_bad_row.fp32.sqnr, abs=0.5)
    assert bad.output_stats["sqnr"] == pytest.approx(host_bad.output_stats["sqnr"], abs=0.5)
    assert "arm_executor_runner's ETDump" in bad.granularity
    assert any("semihosting files" in n for n in bad.notes), bad.notes
    assert any("final outputs from files (bit exact)" in n for n in bad.notes), bad.notes
    assert any("BundleIO check of this case failed" in n for n in bad.notes), bad.notes  # it wrote the ETDump first
    runner = next(n for n in bad.notes if n.startswith("runner: "))
    assert "--etdump, debug buffer 67108864 B = 64 MiB" in runner
    elf = Path(runner.split()[1])
    meta = read_record(elf.parent)
    assert meta["etdump"] is True and meta["debug_buffer_size"] == 64 << 20 and meta["mode"] == "semihosting"
    assert {"ET_EVENT_TRACER_ENABLED", "ET_DUMP_INTERMEDIATE_OUTPUTS", "ET_DEBUG_BUFFER_SIZE=67108864"} <= set(
        meta["flags"]["defines"])
    assert meta["flags"]["method_pool_size"] == (64 << 20) + (64 << 20)  # the pool grew by the buffer

    good = debug_bundle(fp32_bundles / "good.bpte", URL, case=2, work_dir=tmp_path / "good")
    assert good.first_bad is None
    assert all(r.fp32.sqnr > 100 for r in good.rows if r.fp32 is not None)
    assert sum(r.fp32 is not None for r in good.rows) == 9
    assert not _qemu_alive(tmp_path)


def test_debug_cli_on_qemu_prints_the_first_bad_layer(fp32_bundles, tmp_path):  # noqa: F811
    """`bundlerun debug BUNDLE --target qemu://mps3-an547` through the real entry point (the
    runner of the test above comes from the cache)."""
    proc = run_cli("debug", str(fp32_bundles / "bad.bpte"), "--target", URL, "--case", "2", "--report",
                   str(tmp_path / "dbg"), env={"BUNDLERUN_HISTORY": "off"}, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "first bad layer: instruction 4 aten::convolution.out = conv2d_1" in proc.stdout
    assert "qemu://mps3-an547, case 2" in proc.stdout.replace("\n", " ")
    body = json.loads((tmp_path / "dbg" / "report.json").read_text())["debug"]
    assert body["target"] == URL and body["first_bad_layer"]["aot_ops"] == ["conv2d_1"]
    assert body["unmatched"] == 1 and len(body["rows"]) == 10
    (tmp_path / "cli.txt").write_text(proc.stdout)
    assert not _qemu_alive(tmp_path)


def test_qemu_uart_runner_gives_the_same_answer_from_its_base64_block(fp32_bundles, host_bad, tmp_path):  # noqa: F811
    """?mode=uart: the --etdump UART runner prints etdump.bin and debug_buffer.bin base64-encoded
    between '#[RUN THIS]' and '#[END]'; decoded by targets.et_runner.log.etdump_block_files."""
    bad = debug_bundle(fp32_bundles / "bad.bpte", URL + "?mode=uart", case=2, work_dir=tmp_path / "u")
    assert _shape(bad) == _shape(host_bad)
    assert bad.first_bad_row is not None and bad.first_bad_row.aot_ops == ["conv2d_1"]
    assert any("'#[RUN THIS]' base64 block" in n for n in bad.notes), bad.notes
    assert any("final outputs from etdump (bit exact)" in n for n in bad.notes), bad.notes
    assert bad.output_stats["sqnr"] == pytest.approx(host_bad.output_stats["sqnr"], abs=0.5)
    assert not _qemu_alive(tmp_path)


def test_serial_lane_reads_the_etdump_block_off_the_uart(qemu_runner, fp32_bundles, host_bad, tmp_path):  # noqa: F811
    """serial+socket:// with QEMU as the board (as tests/test_qemu_serial.py): per case the lane
    launches QEMU holding the one-case bundle, its UART0 a TCP server; the board's runner is the
    --etdump UART build (debug_elf, substituted as {elf}); the ETDump block comes off the wire."""
    import socket

    bad = fp32_bundles / "bad.bpte"
    elf = qemu_runner("--etdump", "--debug-buffer-size", str(64 << 20), "--mode", "uart", "--ops-from",
                      str(bad)) / "arm_executor_runner.elf"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = ("qemu-system-arm -M mps3-an547 -nographic -monitor none -serial tcp:{host}:{tcp_port},server=on,wait=on "
              "-device loader,file={case_bundle},addr=0x7C000000 -kernel {elf}")
    result = debug_bundle(bad, f"serial+socket://127.0.0.1:{port}", case=2, work_dir=tmp_path / "s",
                          target_config={"launch": launch, "debug_elf": str(elf)})
    assert _shape(result) == _shape(host_bad)
    assert result.first_bad_row is not None and result.first_bad_row.aot_ops == ["conv2d_1"]
    assert any("'#[RUN THIS]' base64 block" in n for n in result.notes), result.notes
    assert result.output_stats["sqnr"] == pytest.approx(host_bad.output_stats["sqnr"], abs=0.5)
    assert not _qemu_alive(tmp_path)


# ------------------------------------------------------------------ (c) the debug buffer runs full


def test_a_debug_buffer_too_small_is_one_line_naming_size_and_fix(qemu_runner, fp32_bundles, tmp_path):  # noqa: F811
    """A runner built with a 256-byte debug buffer: ETDumpGen's log_evalue aborts it on the first
    intermediate (1x8x32x32 floats). One line, the size, the fix; never a partial table."""
    bad = fp32_bundles / "bad.bpte"
    elf = qemu_runner("--etdump", "--debug-buffer-size", "256", "--ops-from", str(bad)) / "arm_executor_runner.elf"
    with pytest.raises(IntermediatesFailed) as info:
        debug_bundle(bad, URL, case=2, work_dir=tmp_path / "w", target_config={"debug_elf": str(elf)})
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{URL}: the runner's debug buffer (256 B) is too small for every intermediate output")
    assert "failed to write tensor to debug buffer" in text
    assert "build_qemu_runner.sh --etdump --debug-buffer-size BYTES" in text
    log = Path(text.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "Ran out of space to store intermediate outputs" in log.read_text(errors="replace")  # the runner said it
    # through the CLI: exit code 2, one error line, no traceback, no "internal error"
    proc = run_cli("debug", str(bad), "--target", URL, "--case", "2", "--target-opt", f"debug_elf={elf}",
                   env={"BUNDLERUN_HISTORY": "off"}, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bundlerun: error: qemu://mps3-an547: the runner's debug buffer "
                                                   "(256 B) is too small"), proc.stderr
    assert "internal error" not in proc.stderr.lower() and "Traceback" not in proc.stderr
    assert not _qemu_alive(tmp_path)


# ------------------------------------------------------------------ (d) a runner built without --etdump


def test_a_runner_without_etdump_says_to_build_one(qemu_runner, fp32_bundles, tmp_path):  # noqa: F811
    plain = qemu_runner() / "arm_executor_runner.elf"  # the zoo-ops runner `run` uses: no event tracer
    meta = read_record(plain.parent)
    assert not meta.get("etdump") and "ET_EVENT_TRACER_ENABLED" not in meta["flags"]["defines"]
    with pytest.raises(IntermediatesUnsupported) as info:
        debug_bundle(fp32_bundles / "bad.bpte", URL, case=2, work_dir=tmp_path / "w",
                     target_config={"debug_elf": str(plain)})
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{URL}: the runner wrote no ETDump (no etdump.bin in its semihosting folder)")
    assert "build_qemu_runner.sh --etdump --ops-from BUNDLE" in text and "debug_elf=PATH" in text
    proc = run_cli("debug", str(fp32_bundles / "bad.bpte"), "--target", URL, "--case", "2", "--target-opt",
                   f"debug_elf={plain}", env={"BUNDLERUN_HISTORY": "off"}, timeout=600)
    assert proc.returncode == 2 and "built without the event tracer" in proc.stderr, proc.stderr
    assert not _qemu_alive(tmp_path)


def test_debug_elf_that_does_not_exist_and_a_buffer_too_large(fp32_bundles, tmp_path):  # noqa: F811
    with pytest.raises(IntermediatesFailed, match="debug_elf .*nope.elf does not exist"):
        debug_bundle(fp32_bundles / "bad.bpte", URL, case=2, work_dir=tmp_path / "a",
                     target_config={"debug_elf": str(tmp_path / "nope.elf")})
    with pytest.raises(IntermediatesFailed, match=r"--debug-buffer-mb 65 does not fit the runner.*at most 64"):
        debug_bundle(fp32_bundles / "bad.bpte", URL, case=2, work_dir=tmp_path / "b", debug_buffer_mb=65)


# ------------------------------------------------------------------ the build script's --etdump options


def test_etdump_builds_have_their_own_library_tree_and_keys(fp32_bundles):  # noqa: F811
    def dry(*args: str) -> list[str]:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), *args, "--dry-run"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    plain, etdump, small = dry(), dry("--etdump"), dry("--etdump", "--debug-buffer-size", "0x100")
    lib = lambda out: next(ln for ln in out if "libraries:" in ln).rsplit(" ", 1)[1]  # noqa: E731
    plain_lib, etdump_lib = lib(plain), lib(etdump)
    assert plain_lib != etdump_lib  # its own tree
    assert lib(small) == etdump_lib  # one tree for every buffer size
    assert len({plain[-1], etdump[-1], small[-1]}) == 3  # three runner keys
    cmake = next(ln for ln in etdump if ln.startswith("cmake "))
    assert "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON" in cmake and "-DEXECUTORCH_BUILD_ARM_ETDUMP=ON" in cmake
    assert "-DBUNDLERUN_DEBUG_BUFFER_SIZE=2097152" in cmake and f"-DEXECUTORCH_ROOT={etdump_lib}/src/executorch" in cmake
    assert "-DBUNDLERUN_DEBUG_BUFFER_SIZE=256" in next(ln for ln in small if ln.startswith("cmake "))
    assert "EVENT_TRACER" not in next(ln for ln in plain if ln.startswith("cmake "))
    for args, needle in ((["--debug-buffer-size", "4096"], "--debug-buffer-size needs --etdump"),
                         (["--etdump", "--debug-buffer-size", "lots"], "--debug-buffer-size must be"),
                         (["--etdump", "--debug-buffer-size", "0x5000000"], "does not fit the method pool"),
                         (["--etdump", "--method-pool-size", "65536", "--debug-buffer-size", "0x8000"],
                          "does not fit the method pool (65536 bytes")):
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), *args, "--dry-run"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    help_text = subprocess.run(["bash", str(BUILD_SCRIPT), "--help"], capture_output=True, text=True).stdout
    assert "--etdump" in help_text and "--debug-buffer-size" in help_text


def test_plain_runs_never_pick_an_etdump_runner(qemu_runner, fp32_bundles):  # noqa: F811
    """The qemu:// target's cache search skips --etdump runners (slower, abort on a full buffer)
    even though their method pool is the largest, which would otherwise win; the debug search
    takes only them, with exactly the debug buffer asked for."""
    from bundlerun.bundles.bpte import read_bundle
    from bundlerun.bundles.program_meta import program_operators
    from bundlerun.targets.arm.qemu import pick_cached_runner

    big = qemu_runner("--etdump", "--debug-buffer-size", str(64 << 20), "--ops-from", str(fp32_bundles / "bad.bpte"))
    assert read_record(big)["flags"]["method_pool_size"] == 128 << 20
    needed = program_operators(read_bundle(fp32_bundles / "bad.bpte").program)
    plain, _ = pick_cached_runner(needed, "semihosting")
    assert plain is not None and not plain.get("etdump") and plain["flags"]["method_pool_size"] < 128 << 20
    chosen, _ = pick_cached_runner(needed, "semihosting", etdump=True, debug_buffer_size=64 << 20)
    assert chosen is not None and chosen["etdump"] is True and chosen["debug_buffer_size"] == 64 << 20
    assert needed <= set(chosen["ops"])
    none, _ = pick_cached_runner(needed, "semihosting", etdump=True, debug_buffer_size=12345)
    assert none is None


# ------------------------------------------------------------------ fvp:// (the FVP double)


def test_fvp_lane_reads_the_semihosting_etdump_files(fp32_bundles, host_bad, tmp_path, monkeypatch):  # noqa: F811
    """Uses the FVP DOUBLE (tests/doubles/fvp): with BUNDLERUN_FVP_ETDUMP=1 it writes the etdump.bin +
    debug_buffer.bin that ExecuTorch's pybindings produce for the case into the semihosting cwd,
    where an --etdump runner writes them. Without it, the lane says to build one with --etdump."""
    from tests.doubles.fvp import install_fvp_doubles

    bin_dir = install_fvp_doubles(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    elf = tmp_path / "runner.elf"
    elf.write_bytes(b"\x7fELF" + b"\0" * 60)
    url = "fvp://corstone-300/cortex-m55"
    monkeypatch.setenv("BUNDLERUN_FVP_ETDUMP", "1")
    bad = debug_bundle(fp32_bundles / "bad.bpte", url, case=2, work_dir=tmp_path / "w",
                       target_config={"debug_elf": str(elf)})
    assert _shape(bad) == _shape(host_bad)
    assert bad.first_bad_row is not None and bad.first_bad_row.aot_ops == ["conv2d_1"]
    assert any("semihosting files" in n for n in bad.notes)
    monkeypatch.setenv("BUNDLERUN_FVP_ETDUMP", "0")
    with pytest.raises(IntermediatesUnsupported, match="no etdump.bin in its semihosting folder.*--etdump"):
        debug_bundle(fp32_bundles / "bad.bpte", url, case=2, work_dir=tmp_path / "x",
                     target_config={"runner_elf": str(elf)})
