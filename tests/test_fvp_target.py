"""fvp:// target end to end through the FVP test double.

The double is installed under the real FVP binary names on PATH; it checks every
option against the real parameter names, runs case 0 of each per-case bundle
through the host ExecuTorch runtime and prints the real runner log. Each
scenario must come back classified, with nothing left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from bundlerun.bundles.bpte import read_bundle, serialize_bundle
from bundlerun.bundles.errors import TargetError
from bundlerun.targets import open_target, parse_target_url
from bundlerun.targets.base import CaseStatus, RunOptions
from bundlerun.targets.arm.fvp import FVP_300_U55, FVP_300_U65, FVP_320, fvp_command, parse_variant
from doubles.fvp import install_fvp_doubles

U55 = "fvp://corstone-300/ethos-u55-128"
U85 = "fvp://corstone-320/ethos-u85-256"


def _build_with_executorch(path: Path) -> Path:
    """Fallback bundle built with ExecuTorch's own BundledProgram API."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)).eval()
    xs = [(torch.randn(1, 8),) for _ in range(2)]
    prog = to_edge_transform_and_lower(torch.export.export(model, xs[0]), partitioner=[XnnpackPartitioner()]).to_executorch()
    suite = MethodTestSuite("forward", [MethodTestCase(inputs=x, expected_outputs=(model(*x),)) for x in xs])
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(BundledProgram(prog, [suite])))
    return path


@pytest.fixture(scope="module")
def bundle_path(bundle_cache, tmp_path_factory) -> Path:
    try:  # the session-wide cache (conftest) shares the build with other test files
        return Path(bundle_cache("mlp", backend="portable", cases=2, target="host://portable"))
    except Exception:  # builder not usable: ExecuTorch's own API makes an equivalent bundle
        return _build_with_executorch(tmp_path_factory.mktemp("bundle") / "mlp.bpte")


@pytest.fixture(scope="module")
def bundle(bundle_path):
    return read_bundle(bundle_path)


@pytest.fixture()
def fvp_env(tmp_path, monkeypatch):
    """Doubles on PATH, a dummy semihosting ELF, a PID file; on teardown every
    process the double started must be gone."""
    bindir = install_fvp_doubles(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    pidfile = tmp_path / "pids"
    argsfile = tmp_path / "args"
    monkeypatch.setenv("BUNDLERUN_FVP_PIDFILE", str(pidfile))
    monkeypatch.setenv("BUNDLERUN_FVP_ARGSFILE", str(argsfile))
    monkeypatch.delenv("BUNDLERUN_FVP_SCENARIO", raising=False)
    elf = tmp_path / "arm_executor_runner"
    elf.write_bytes(b"\x7fELF" + bytes(60))
    env = {"elf": elf, "pidfile": pidfile, "argsfile": argsfile, "bindir": bindir, "tmp": tmp_path}
    yield env
    pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
    deadline = time.monotonic() + 10
    alive = [p for p in pids if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    assert not alive, f"FVP double processes still running: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _run(url, bundle, bundle_path, env, *, scenario="pass", cases=None, work=None, **cfg):
    os.environ["BUNDLERUN_FVP_SCENARIO"] = scenario
    config = {"runner_elf": str(env["elf"]), "timelimit": 60, "host_timeout_grace_s": 15}
    config.update(cfg)
    target = open_target(url, config)
    options = RunOptions(work_dir=work or env["tmp"] / "work", cases=cases)
    return target.run(bundle, bundle_path, options)


def _expected(bundle, i):
    return bundle.suite("forward").test_cases[i].expected_outputs[0].to_array()


def _args(env) -> list[list[str]]:
    return [json.loads(line) for line in env["argsfile"].read_text().splitlines()]


# -- URL and command line -----------------------------------------------------------


@pytest.mark.parametrize(
    "url,binary,macs",
    [
        ("fvp://corstone-300/ethos-u55-128", FVP_300_U55, 128),
        ("fvp://corstone-300/ethos-u65-256", FVP_300_U65, 256),
        ("fvp://corstone-320/ethos-u85-256", FVP_320, 256),
        ("fvp://corstone-300/cortex-m55", FVP_300_U55, 128),
        ("fvp://corstone-320/cortex-m85", FVP_320, 128),
    ],
)
def test_variants_map_to_the_right_fvp(url, binary, macs):
    u = parse_target_url(url)
    v = parse_variant(u.netloc, u.path)
    assert (v.fvp, v.num_macs) == (binary, macs)


@pytest.mark.parametrize(
    "url,needle",
    [
        ("fvp://corstone-300/ethos-u85-256", "corstone-320"),
        ("fvp://corstone-300/ethos-u55-512", "no 512-MAC"),
        ("fvp://corstone-310/ethos-u55-128", "unknown Corstone platform"),
        ("fvp://corstone-320/cortex-m55", "corstone-300"),
        ("fvp://corstone-300/npu", "unknown processor"),
    ],
)
def test_bad_urls_are_one_line_errors(url, needle):
    with pytest.raises(TargetError, match=needle):
        open_target(url, {})


def test_corstone320_command_uses_mps4_options(tmp_path):
    u = parse_target_url(U85)
    cmd = fvp_command(
        parse_variant(u.netloc, u.path), Path("FVP"), Path("r.elf"), 30,
        semihosting_cwd=tmp_path, cmd_line="executor_runner -m model.bpte -i dummy.bin -o out", fast=True,
    )
    opts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-C"]
    assert "mps4_board.subsystem.ethosu.num_macs=256" in opts
    assert "mps4_board.uart0.unbuffered_output=1" in opts
    assert "vis_hdlcd.disable_visualisation=1" in opts
    assert "mps4_board.subsystem.ethosu.extra_args=--fast" in opts
    assert f"mps4_board.subsystem.cpu0.semihosting-cwd={tmp_path}" in opts
    assert not any(o.startswith(("cpu0.", "ethosu.", "mps3_board.")) for o in opts)
    assert cmd[-4:] == ["-a", "r.elf", "--timelimit", "30"]


def test_double_rejects_unknown_parameter_and_reports_version(fvp_env):
    fvp = str(fvp_env["bindir"] / FVP_300_U55)
    bad = subprocess.run([fvp, "-C", "mps4_board.uart0.out_file=-", "-a", str(fvp_env["elf"])], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "mps4_board.uart0.out_file" in bad.stderr
    ver = subprocess.run([fvp, "--version"], capture_output=True, text=True, timeout=60)
    assert ver.returncode == 0 and "Fast Models" in ver.stdout


# -- semihosting scenarios --------------------------------------------------------


def test_pass_every_case_collected(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env)
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.OK]
    for c in run.cases:
        got = c.outputs[0].to_array()
        np.testing.assert_allclose(got, _expected(bundle, c.case_index), rtol=1e-4, atol=1e-5)
        assert not c.outputs[0].lossy
        assert c.device_verdict["verdict"] == "PASS"
        assert set(c.device_verdict["error_stats"]) == {"mean_absolute_error", "max_absolute_error", "mean_relative_error", "max_relative_error"}
        assert Path(c.log_path).is_file() and "Program complete, exiting." in Path(c.log_path).read_text()
    # each case ran its own bundle: case 1's outputs differ from case 0's
    assert not np.array_equal(run.cases[0].outputs[0].to_array(), run.cases[1].outputs[0].to_array())
    for argv in _args(fvp_env):
        opts = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-C")
        assert len(opts["cpu0.semihosting-cmd_line"]) < 256
        assert opts["cpu0.semihosting-cmd_line"] == "executor_runner -m model.bpte -i dummy.bin -o out"
        assert opts["mps3_board.uart0.out_file"] == "-" and opts["ethosu.num_macs"] == "128"
        assert Path(opts["cpu0.semihosting-cwd"], "dummy.bin").stat().st_size == 4


def test_corstone320_pass(bundle, bundle_path, fvp_env):
    run = _run(U85, bundle, bundle_path, fvp_env, cases=[1], fast=True)
    (case,) = run.cases
    assert case.status is CaseStatus.OK and case.case_index == 1
    np.testing.assert_allclose(case.outputs[0].to_array(), _expected(bundle, 1), rtol=1e-4, atol=1e-5)
    argv = _args(fvp_env)[0]
    assert Path(argv[0]).name == FVP_320
    assert "mps4_board.subsystem.ethosu.extra_args=--fast" in argv
    assert run.info["fvp_version"].startswith("Fast Models") and run.info["fast"] is True


def test_numerical_failure_is_collected_not_an_error(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="numerical", cases=[0])
    (case,) = run.cases
    assert case.status is CaseStatus.OK, case.error  # judging numerics is runner/'s job
    diff = case.outputs[0].to_array() - _expected(bundle, 0)
    assert np.allclose(diff, 0.5, atol=1e-4)
    assert case.device_verdict["verdict"] == "FAIL"
    assert case.device_verdict["status"] == 0x20
    assert case.device_verdict["tolerances"] == {"rtol": 0.01, "atol": 0.01}
    assert case.device_verdict["error_stats"]["max_absolute_error"] == pytest.approx(0.5, abs=1e-4)


def test_runner_verdict_fail_with_good_outputs(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="verdict-fail", cases=[1])
    (case,) = run.cases
    assert case.status is CaseStatus.OK
    np.testing.assert_allclose(case.outputs[0].to_array(), _expected(bundle, 1), rtol=1e-4, atol=1e-5)
    assert case.device_verdict["verdict"] == "FAIL" and case.device_verdict["tolerances"] == {"rtol": 0.0, "atol": 0.0}


def test_hard_fault(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="hard-fault", cases=[0], timelimit=1, host_timeout_grace_s=20)
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.ERROR, "hard-fault")
    assert any("Hard fault" in line for line in case.log_excerpt)
    assert "Hard fault" in Path(case.log_path).read_text()
    assert not case.outputs


def test_cpu_time_exceeded_is_timeout(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="cpu-time", cases=[0], timelimit=1, host_timeout_grace_s=20)
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.TIMEOUT, "cpu-time-limit")
    assert any("CPU time has been exceeded" in line for line in case.log_excerpt)
    assert case.elapsed_s < 15


def test_hang_is_killed_with_its_process_group(bundle, bundle_path, fvp_env):
    t0 = time.monotonic()
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="hang", cases=[0], timelimit=1, host_timeout_grace_s=2)
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.TIMEOUT, "host-timeout")
    assert time.monotonic() - t0 < 20
    pids = [int(x) for x in fvp_env["pidfile"].read_text().split()]
    assert len(pids) == 2  # the double and the child it started; the fixture asserts both are gone
    assert case.log_excerpt and Path(case.log_path).is_file()


def test_garbage_output(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="garbage", cases=[0])
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.ERROR, "no-runner-output")
    assert case.log_excerpt  # the garbage is shown, decoded with replacement characters


def test_missing_outputs_even_with_stale_files(bundle, bundle_path, fvp_env):
    work = fvp_env["tmp"] / "shared-work"
    stale = work / "fvp" / "forward-0" / "out-0.bin"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(_expected(bundle, 0).tobytes())  # right size: would pass if read
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="missing-outputs", cases=[0], work=work)
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.ERROR, "missing-output")
    assert "found 0" in case.error and not stale.exists()


def test_wrong_size_outputs(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="wrong-size", cases=[0])
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.ERROR, "wrong-output-size")
    assert "out-0.bin has 20 bytes, expected 40" in case.error


def test_reboot_mid_run(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="reboot", cases=[0])
    assert (run.cases[0].status, run.cases[0].error_kind) == (CaseStatus.ERROR, "reboot")


# -- missing tools ------------------------------------------------------------------


def test_missing_fvp_names_searched_locations(bundle, bundle_path, fvp_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TargetError) as err:
        _run(U55, bundle, bundle_path, fvp_env, fvp_path=str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert FVP_300_U55 in msg and str(tmp_path / "nowhere") in msg and str(tmp_path / "empty") in msg
    assert "\n" not in msg


def test_fvp_path_config_and_missing_elf(bundle, bundle_path, fvp_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TargetError, match="no semihosting BundleIO arm_executor_runner ELF.*missing.elf"):
        _run(U55, bundle, bundle_path, fvp_env, fvp_path=str(fvp_env["bindir"]), runner_elf=str(tmp_path / "missing.elf"))


def test_per_target_elf_table(fvp_env, tmp_path):
    from bundlerun.targets.arm.fvp import find_runner_elf

    u85 = tmp_path / "u85.elf"
    u85.write_bytes(b"\x7fELF")
    cfg = {"runner_elf": str(fvp_env["elf"]), "corstone-320/ethos-u85-256": {"runner_elf": str(u85)}}
    u = parse_target_url(U85)
    assert find_runner_elf(parse_variant(u.netloc, u.path), cfg, uart=False)[0] == u85
    u = parse_target_url(U55)
    assert find_runner_elf(parse_variant(u.netloc, u.path), cfg, uart=False)[0] == fvp_env["elf"]
    table = {"runner_elfs": {"ethos-u55-128": str(u85)}}
    assert find_runner_elf(parse_variant(u.netloc, u.path), table, uart=False)[0] == u85


# -- UART-only runner -------------------------------------------------------------


def test_uart_linked_bundle_printed_outputs(bundle, bundle_path, fvp_env, tmp_path):
    elf = tmp_path / "uart_runner.elf"
    blob = serialize_bundle(bundle.single_case("forward", 0))
    elf.write_bytes(b"\x7fELF" + bytes(124) + blob + bytes(64))  # the bundle sits in the ELF's data
    run = _run(U55, bundle, bundle_path, fvp_env, mode="uart", uart_runner_elf=str(elf))
    first, second = run.cases
    assert first.status is CaseStatus.OK and first.outputs[0].lossy
    np.testing.assert_allclose(first.outputs[0].to_array(), _expected(bundle, 0), atol=1e-6, rtol=0)
    assert first.device_verdict["verdict"] == "PASS"
    assert second.status is CaseStatus.SKIP and "case 0 only" in second.error
    argv = _args(fvp_env)[0]
    assert not any("semihosting" in a for a in argv)


def test_uart_with_data_address_runs_every_case(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, mode="uart", model_addr="0x70000000")
    assert [c.status for c in run.cases] == [CaseStatus.OK, CaseStatus.OK]
    for c in run.cases:
        np.testing.assert_allclose(c.outputs[0].to_array(), _expected(bundle, c.case_index), atol=1e-6, rtol=0)
    data_args = [a[a.index("--data") + 1] for a in _args(fvp_env)]
    assert all(d.endswith("@0x70000000") for d in data_args)


def test_uart_etdump_outputs_are_bit_exact(bundle, bundle_path, fvp_env, monkeypatch):
    monkeypatch.setenv("BUNDLERUN_FVP_ETDUMP", "1")
    monkeypatch.setenv("BUNDLERUN_FVP_LOG_OUTPUT", "0")  # only the ETDump channel carries outputs
    run = _run(U55, bundle, bundle_path, fvp_env, mode="uart", model_addr="0x70000000", cases=[1])
    (case,) = run.cases
    assert case.status is CaseStatus.OK, case.error
    assert not case.outputs[0].lossy
    np.testing.assert_allclose(case.outputs[0].to_array(), _expected(bundle, 1), rtol=1e-4, atol=1e-5)
    log = Path(case.log_path).read_text()
    assert "#[RUN THIS]" in log and ">debug_buffer.bin" in log and "Output[0][0]" not in log


# -- firmware scripts and doctor ------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
ARM_SCRIPTS = REPO / "firmware_scripts" / "arm"


def test_manifest_tolerance_prints_the_bundles_loosest_criteria(bundle, bundle_path):
    import sys

    outs = bundle.manifest.methods["forward"].outputs if bundle.manifest else []
    res = subprocess.run([sys.executable, str(ARM_SCRIPTS / "manifest_tolerance.py"), "--cmake", str(bundle_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    if outs:
        want_atol = max(o.criteria.effective_atol for o in outs)
        assert res.stdout.strip() == f"-DET_ATOL={want_atol:g} -DET_RTOL={max(o.criteria.rtol or 0 for o in outs):g}"
    else:
        assert res.stdout.strip() == "-DET_ATOL=0.01 -DET_RTOL=0.01"
    bad = subprocess.run([sys.executable, str(ARM_SCRIPTS / "manifest_tolerance.py"), __file__], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "BundleIO" in bad.stderr


def test_build_runner_composes_executorch_flags(bundle_path, tmp_path):
    import sys

    et = tmp_path / "et"
    (et / "backends/arm/scripts").mkdir(parents=True)
    (et / "backends/arm/scripts/build_executor_runner.sh").write_text("#!/bin/sh\n")
    script = str(ARM_SCRIPTS / "build_runner.sh")
    semi = subprocess.run([script, f"--et-root={et}", "--target=ethos-u85-256", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert semi.returncode == 0, semi.stderr
    assert "--pte=semihosting --bundleio --target=ethos-u85-256" in semi.stdout
    uart = subprocess.run([script, f"--et-root={et}", "--mode=uart", f"--bundle={bundle_path}", "--etdump",
                           f"--python={sys.executable}", "--dry-run"], capture_output=True, text=True, timeout=120)
    assert uart.returncode == 0, uart.stderr
    assert f"--pte={bundle_path.resolve()}" in uart.stdout and "-DET_ATOL=" in uart.stdout and "-DET_DUMP_OUTPUTS=ON" in uart.stdout
    (et / "backends/cortex_m/test").mkdir(parents=True)
    (et / "backends/cortex_m/test/build_test_runner.sh").write_text("#!/bin/sh\n")
    m55 = subprocess.run([script, f"--et-root={et}", "--target=cortex-m55", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert m55.returncode == 0 and m55.stdout.split() == [str(et / "backends/cortex_m/test/build_test_runner.sh"), "--target=cortex-m55"]
    bad = subprocess.run([script, f"--et-root={et}", "--target=ethos-u55-512", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown --target" in bad.stderr


def test_check_fvp_and_doctor_see_the_installed_fvps(fvp_env, tmp_path):
    import sys

    from click.testing import CliRunner

    from bundlerun.runner.commands.doctor import command

    res = subprocess.run([str(ARM_SCRIPTS / "check_fvp.sh"), "--all"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.count(" OK ") == 3, res.stdout
    cfg = tmp_path / "bundlerun.toml"
    cfg.write_text(f'[targets.fvp]\nrunner_elf = "{fvp_env["elf"]}"\n[targets.fvp."corstone-320/ethos-u85-256"]\nrunner_elf = "{tmp_path}/nope.elf"\n')
    out = CliRunner().invoke(command, ["--config", str(cfg), "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["component"]: r for r in json.loads(out.output)["checks"]}
    assert all(rows[name]["ok"] and "Fast Models" in rows[name]["detail"] for name in (FVP_300_U55, FVP_300_U65, FVP_320))
    assert rows["runner ELF runner_elf"]["ok"] and rows["runner ELF runner_elf"]["detail"] == "ELF, machine 0"
    assert rows["runner ELF corstone-320/ethos-u85-256 runner_elf"]["ok"] is False
    from importlib import metadata

    assert rows["executorch"]["detail"] == metadata.version("executorch")
    light = subprocess.run([sys.executable, "-c", "import sys, bundlerun.runner.commands.doctor; assert 'torch' not in sys.modules"],
                           capture_output=True, text=True, timeout=60)
    assert light.returncode == 0, light.stderr


def test_fvp_rejecting_an_option_is_a_classified_error(bundle, bundle_path, fvp_env):
    run = _run(U55, bundle, bundle_path, fvp_env, cases=[0], extra_args="cpu0.no_such_param=1")
    (case,) = run.cases
    assert (case.status, case.error_kind) == (CaseStatus.ERROR, "tool-failed")
    assert "cpu0.no_such_param" in case.error and case.error.count("\n") == 0


def test_uart_fvp_lingering_after_eot_is_stopped(bundle, bundle_path, fvp_env):
    t0 = time.monotonic()
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="linger", mode="uart", model_addr="0x70000000", cases=[0],
               exit_grace_s=1)
    (case,) = run.cases
    assert case.status is CaseStatus.OK and case.extra.get("fvp_killed_after_finish") is True
    np.testing.assert_allclose(case.outputs[0].to_array(), _expected(bundle, 0), atol=1e-6, rtol=0)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("url", [
    "fvp://corstone-300/ethos-u55-128", "fvp://corstone-300/ethos-u65-256", "fvp://corstone-320/ethos-u85-256",
    "fvp://corstone-300/cortex-m55", "fvp://corstone-320/cortex-m85",
])
@pytest.mark.parametrize("mode", ["semihosting", "uart"])
def test_every_variant_command_is_accepted_by_its_fvp(url, mode, bundle, bundle_path, fvp_env):
    # 'garbage' makes the double stop right after validating the command line, so an
    # option the platform does not know would show up as fvp-failed instead.
    run = _run(url, bundle, bundle_path, fvp_env, scenario="garbage", cases=[0], mode=mode, fast=True,
               model_addr="0x70000000" if mode == "uart" else None)
    (case,) = run.cases
    assert case.error_kind == "no-runner-output", case.error
    argv = _args(fvp_env)[0]
    assert Path(argv[0]).name == parse_variant(parse_target_url(url).netloc, parse_target_url(url).path).fvp
    assert any("semihosting-cmd_line" in a for a in argv) == (mode == "semihosting")


def test_uart_numerical_failure_stops_once_the_runner_aborts(bundle, bundle_path, fvp_env):
    t0 = time.monotonic()
    run = _run(U55, bundle, bundle_path, fvp_env, scenario="numerical", mode="uart", model_addr="0x70000000",
               cases=[0], timelimit=120, exit_grace_s=1)
    (case,) = run.cases
    assert case.status is CaseStatus.OK, case.error  # outputs were printed before the verdict
    assert case.device_verdict["verdict"] == "FAIL" and case.extra.get("fvp_killed_after_finish")
    np.testing.assert_allclose(case.outputs[0].to_array() - _expected(bundle, 0), 0.5, atol=2e-6)
    assert time.monotonic() - t0 < 60  # did not sit out the 120 s --timelimit
